"""Headers a repository's CMake build generates from templates (miner.configured): made from the
CMake files' defaults, so code including them builds as the repository's own build would."""

from __future__ import annotations

import subprocess

from conftest import write_tree

from miner.configured import cmake_values, configure
from miner.discover import discover
from miner.sources import scan_tree

# pyg-lib's pattern, written afresh: a function-like macro whose value CMake fills in
CMAKE = """cmake_minimum_required(VERSION 3.18)
project(pkg)
set(WITH_FAST_BLAS 0)
option(USE_OPENMP "parallel loops" ON)
option(WITH_DEBUG "checks" OFF)
if(FAST_BLAS_FOUND)
  set(WITH_FAST_BLAS 1)
endif()
configure_file(pkg/csrc/config.h.in pkg/csrc/config.h)
"""
TEMPLATE = """#pragma once
#define WITH_FAST_BLAS() @WITH_FAST_BLAS@
#cmakedefine USE_OPENMP
#cmakedefine WITH_DEBUG 1
#cmakedefine01 WITH_DEBUG
#define VERSION_TAG ${PKG_VERSION}
"""
USER = """#include "pkg/csrc/config.h"
#if WITH_FAST_BLAS()
#error "the optional library is off by default"
#endif
#ifndef USE_OPENMP
#error "an option on by default is defined"
#endif
#ifdef WITH_DEBUG
#if WITH_DEBUG
#error "an option off by default is 0"
#endif
#endif
int scaled(int x) { return VERSION_TAG + x; }
"""


def test_a_template_is_configured_with_the_cmake_defaults():
    values = cmake_values([CMAKE])
    assert values["WITH_FAST_BLAS"] == "0"  # the first set, not the one a found library makes
    assert (values["USE_OPENMP"], values["WITH_DEBUG"]) == ("ON", "OFF")
    text = configure(TEMPLATE, values)
    assert "#define WITH_FAST_BLAS() 0" in text
    assert "#define USE_OPENMP\n" in text and "/* #undef WITH_DEBUG */" in text
    assert "#define WITH_DEBUG 0" in text  # cmakedefine01
    assert "#define VERSION_TAG 0" in text  # nothing sets it: 0, never an empty #if


def test_the_tree_holds_the_generated_header_and_code_including_it_builds(tmp_path):
    """Before, pyg-lib's random_walk CPU implementation (through rand_engine.h's
    `#if WITH_MKL_BLAS()`) did not preprocess: its kernel got no drafted calls and no test."""
    repo = write_tree(
        tmp_path / "repo",
        {
            "CMakeLists.txt": CMAKE,
            "pkg/csrc/config.h.in": TEMPLATE,
            "pkg/csrc/ops/scale.cpp": USER,
            "pkg/csrc/done.h.in": "#define DONE 1\n",
            "pkg/csrc/done.h": "#define DONE 2\n",  # a header the tree has stays as written
        },
    )
    files = {f.rel: f.data for f in scan_tree(repo).files}
    assert files["pkg/csrc/done.h"] == b"#define DONE 2\n"
    assert b"#define WITH_FAST_BLAS() 0" in files["pkg/csrc/config.h"]
    disc = discover(repo)
    assert "#define WITH_FAST_BLAS() 0" in disc.models["pkg/csrc/config.h"].text
    out = tmp_path / "built"
    write_tree(out, {"pkg/csrc/config.h": files["pkg/csrc/config.h"], "scale.cpp": USER})
    done = subprocess.run(
        ["g++", "-fsyntax-only", f"-I{out}", str(out / "scale.cpp")], capture_output=True
    )
    assert done.returncode == 0, done.stderr.decode()
