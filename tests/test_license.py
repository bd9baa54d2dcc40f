"""detect_license: one realistic text per family, metadata fallbacks, and honest "unknown"."""

from pathlib import Path

import pytest

from miner.license import detect_license, spdx_from_name

MIT = """MIT License

Copyright (c) 2020 Jane Doe

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.
"""

APACHE = """Copyright (c) OpenMMLab. All rights reserved.

                                 Apache License
                           Version 2.0, January 2004
                        http://www.apache.org/licenses/

   TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION
"""

APACHE_NOTICE = """Copyright 2021 Acme

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0
"""

BSD_HEAD = """Copyright (c) 2019, The Authors
All rights reserved.

Redistribution and use in source and binary forms, with or without
modification, are permitted provided that the following conditions are met:

1. Redistributions of source code must retain the above copyright notice, this
   list of conditions and the following disclaimer.

2. Redistributions in binary form must reproduce the above copyright notice,
   this list of conditions and the following disclaimer in the documentation
   and/or other materials provided with the distribution.
"""
BSD3 = (
    BSD_HEAD
    + """
3. Neither the name of the copyright holder nor the names of its
   contributors may be used to endorse or promote products derived from
   this software without specific prior written permission.

THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS "AS IS"
"""
)
BSD2 = (
    BSD_HEAD
    + """
THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS "AS IS"
"""
)

GPL2 = """                    GNU GENERAL PUBLIC LICENSE
                       Version 2, June 1991

 Copyright (C) 1989, 1991 Free Software Foundation, Inc.,
...
consider it more useful to permit linking proprietary applications with the
library.  If this is what you want to do, use the GNU Lesser General
Public License instead of this License.
"""

GPL3 = """                    GNU GENERAL PUBLIC LICENSE
                       Version 3, 29 June 2007

 Copyright (C) 2007 Free Software Foundation, Inc. <https://fsf.org/>
...
But first, please read <https://www.gnu.org/licenses/why-not-lgpl.html>.
use the GNU Lesser General Public License instead of this License.
"""

GPL3_NOTICE = """kernels - fast CUDA kernels
Copyright (C) 2022  Someone

This program is free software: you can redistribute it and/or modify
it under the terms of the GNU General Public License as published by
the Free Software Foundation, either version 3 of the License, or
(at your option) any later version.
"""

LGPL21 = """                  GNU LESSER GENERAL PUBLIC LICENSE
                       Version 2.1, February 1999

 Copyright (C) 1991, 1999 Free Software Foundation, Inc.
[This is the first released version of the Lesser GPL.  It also counts
 as the successor of the GNU Library Public License, version 2, hence
 the version number 2.1.]
"""

LGPL3 = """                   GNU LESSER GENERAL PUBLIC LICENSE
                       Version 3, 29 June 2007

  This version of the GNU Lesser General Public License incorporates
the terms and conditions of version 3 of the GNU General Public
License, supplemented by the additional permissions listed below.
"""

AGPL3 = """                    GNU AFFERO GENERAL PUBLIC LICENSE
                       Version 3, 19 November 2007

 Copyright (C) 2007 Free Software Foundation, Inc. <https://fsf.org/>
  The GNU Affero General Public License is a free, copyleft license for
software and other kinds of works, specifically designed to ensure
cooperation with the community in the case of network server software.
"""

MPL2 = """Mozilla Public License Version 2.0
==================================

1. Definitions
--------------
1.1. "Contributor"
"""

UNLICENSE = """This is free and unencumbered software released into the public domain.

Anyone is free to copy, modify, publish, use, compile, sell, or
distribute this software, either in source code form or as a compiled
binary, for any purpose, commercial or non-commercial, and by any
means.
"""

ISC = """ISC License

Copyright (c) 2004-2010 by Internet Systems Consortium, Inc. ("ISC")

Permission to use, copy, modify, and/or distribute this software for any
purpose with or without fee is hereby granted, provided that the above
copyright notice and this permission notice appear in all copies.
"""

BSL = """Boost Software License - Version 1.0 - August 17th, 2003

Permission is hereby granted, free of charge, to any person or organization
obtaining a copy of the software and accompanying documentation covered by
this license (the "Software") to use, reproduce, display, distribute,
"""

CC0 = """Creative Commons Legal Code

CC0 1.0 Universal

    CREATIVE COMMONS CORPORATION IS NOT A LAW FIRM AND DOES NOT PROVIDE
    LEGAL SERVICES.
"""

ZLIB = """Copyright (C) 1995-2017 Jean-loup Gailly and Mark Adler

This software is provided 'as-is', without any express or implied
warranty.  In no event will the authors be held liable for any damages
arising from the use of this software.

Permission is granted to anyone to use this software for any purpose,
including commercial applications, and to alter it and redistribute it
freely, subject to the following restrictions:

1. The origin of this software must not be misrepresented; you must not
   claim that you wrote the original software.
2. Altered source versions must be plainly marked as such, and must not be
   misrepresented as being the original software.
"""

MADE_UP = """The Frobnicator Public Licence

You may run this code on Tuesdays only. Redistribution requires a handwritten
letter to the author. All other rights reserved.
"""


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize(
    "name, text, spdx",
    [
        ("LICENSE", MIT, "MIT"),
        ("LICENSE", APACHE, "Apache-2.0"),
        ("LICENSE.txt", APACHE_NOTICE, "Apache-2.0"),
        ("LICENSE", BSD3, "BSD-3-Clause"),
        ("LICENSE.md", BSD2, "BSD-2-Clause"),
        ("COPYING", GPL2, "GPL-2.0"),
        ("COPYING", GPL3, "GPL-3.0"),
        ("LICENSE", GPL3_NOTICE, "GPL-3.0"),
        ("COPYING.LIB", LGPL21, "LGPL-2.1"),
        ("LICENSE", LGPL3, "LGPL-3.0"),
        ("LICENSE", AGPL3, "AGPL-3.0"),
        ("LICENSE", MPL2, "MPL-2.0"),
        ("UNLICENSE", UNLICENSE, "Unlicense"),
        ("LICENSE", ISC, "ISC"),
        ("LICENSE_1_0.txt", BSL, "BSL-1.0"),
        ("LICENCE", CC0, "CC0-1.0"),
        ("LICENSE", ZLIB, "Zlib"),
    ],
)
def test_license_texts(tmp_path, name, text, spdx):
    write(tmp_path, {name: text, "README.md": "# kernels\n"})
    assert detect_license(tmp_path) == (spdx, name)


def test_project_license_wins_over_third_party_notices(tmp_path):
    write(tmp_path, {"LICENSE": MIT + "\n\nThird-party code in csrc/cub:\n\n" + APACHE})
    assert detect_license(tmp_path) == ("MIT", "LICENSE")
    write(tmp_path, {"LICENSE": BSD3 + "\n\nParts of this are from:\n\n" + MIT})
    assert detect_license(tmp_path) == ("BSD-3-Clause", "LICENSE")


def test_lesser_gpl_pair(tmp_path):
    write(tmp_path, {"COPYING": GPL3, "COPYING.LESSER": LGPL3})
    assert detect_license(tmp_path) == ("LGPL-3.0", "COPYING.LESSER")


def test_license_file_preferred_over_other_license_files(tmp_path):
    write(tmp_path, {"LICENSE-THIRD-PARTY": MIT, "license.rst": APACHE})
    assert detect_license(tmp_path) == ("Apache-2.0", "license.rst")


@pytest.mark.parametrize(
    "line, spdx",
    [
        ("SPDX-License-Identifier: BSD-3-Clause", "BSD-3-Clause"),
        ("// SPDX-License-Identifier: apache-2.0 OR mit", "Apache-2.0 OR MIT"),
        (
            "/* SPDX-License-Identifier: GPL-2.0-only WITH Linux-syscall-note */",
            "GPL-2.0-only WITH Linux-syscall-note",
        ),
    ],
)
def test_spdx_identifier_line(tmp_path, line, spdx):
    write(tmp_path, {"LICENSE": f"Copyright 2024 Acme\n{line}\n\n{MADE_UP}"})
    assert detect_license(tmp_path) == (spdx, "LICENSE")


def test_made_up_license_is_unknown(tmp_path):
    write(tmp_path, {"LICENSE": MADE_UP, "setup.py": "from setuptools import setup\nsetup()\n"})
    assert detect_license(tmp_path) == ("unknown", "")


def test_no_license_at_all(tmp_path):
    assert detect_license(tmp_path) == ("unknown", "")


@pytest.mark.parametrize(
    "files, want",
    [
        ({"pyproject.toml": '[project]\nname = "k"\nlicense = "MIT"\n'}, ("MIT", "pyproject.toml")),
        (
            {"pyproject.toml": '[project]\nname = "k"\nlicense = {text = "Apache License 2.0"}\n'},
            ("Apache-2.0", "pyproject.toml"),
        ),
        (
            {"pyproject.toml": '[project]\nlicense = "MIT OR Apache-2.0"\n'},
            ("MIT OR Apache-2.0", "pyproject.toml"),
        ),
        (
            {"pyproject.toml": '[tool.poetry]\nname = "k"\nlicense = "BSD-2-Clause"\n'},
            ("BSD-2-Clause", "pyproject.toml"),
        ),
        (
            {
                "pyproject.toml": '[project]\nname = "k"\nclassifiers = [\n'
                '  "License :: OSI Approved :: MIT License",\n'
                '  "Programming Language :: Python :: 3",\n]\n'
            },
            ("MIT", "pyproject.toml"),
        ),
        (
            {"pyproject.toml": '[project]\nlicense = {file = "docs/TERMS"}\n', "docs/TERMS": BSD3},
            ("BSD-3-Clause", "pyproject.toml"),
        ),
        ({"setup.cfg": "[metadata]\nname = k\nlicense = BSD\n"}, ("BSD-3-Clause", "setup.cfg")),
        (
            {
                "setup.cfg": "[metadata]\nname = k\nclassifiers =\n"
                "    License :: OSI Approved :: Apache Software License\n"
            },
            ("Apache-2.0", "setup.cfg"),
        ),
        (
            {"setup.py": 'from setuptools import setup\nsetup(name="k", license="GPLv3")\n'},
            ("GPL-3.0", "setup.py"),
        ),
        (
            {
                "setup.py": "setup(\n    name='k',\n    classifiers=[\n"
                "        'License :: OSI Approved :: BSD License',\n    ],\n)\n"
            },
            ("BSD-3-Clause", "setup.py"),
        ),
        ({"package.json": '{"name": "k", "license": "ISC"}'}, ("ISC", "package.json")),
        ({"package.json": '{"name": "k", "license": {"type": "MIT"}}'}, ("MIT", "package.json")),
        (
            {"LICENSE": MADE_UP, "setup.cfg": "[metadata]\nlicense = MIT License\n"},
            ("MIT", "setup.cfg"),
        ),
        (
            {"pyproject.toml": "this is [[ not toml", "setup.cfg": "[metadata]\nlicense = Zlib\n"},
            ("Zlib", "setup.cfg"),
        ),
        ({"pyproject.toml": '[project]\nlicense = "Proprietary"\n'}, ("unknown", "")),
        ({"setup.py": 'setup(license="GPL")\n'}, ("unknown", "")),
    ],
)
def test_package_metadata(tmp_path, files, want):
    write(tmp_path, files)
    assert detect_license(tmp_path) == want


def test_setup_py_is_never_executed(tmp_path):
    marker = tmp_path / "ran"
    write(tmp_path, {"setup.py": f'open("{marker}", "w").write("x")\nsetup(license="MIT")\n'})
    assert detect_license(tmp_path) == ("MIT", "setup.py")
    assert not marker.exists()


def test_license_file_outside_root_is_not_followed(tmp_path):
    (tmp_path / "outside").write_text(MIT)
    pyproject = '[project]\nlicense = {file = "../outside"}\n'
    root = write(tmp_path / "repo", {"pyproject.toml": pyproject})
    assert detect_license(root) == ("unknown", "")


@pytest.mark.parametrize(
    "name, spdx",
    [
        ("MIT", "MIT"),
        ("MIT License", "MIT"),
        ("the mit licence", "MIT"),
        ("Expat", "MIT"),
        ("Apache License 2.0", "Apache-2.0"),
        ("Apache License, Version 2.0", "Apache-2.0"),
        ("Apache 2", "Apache-2.0"),
        ("apache-2.0", "Apache-2.0"),
        ("ASL 2.0", "Apache-2.0"),
        ("BSD", "BSD-3-Clause"),
        ("BSD License", "BSD-3-Clause"),
        ("New BSD", "BSD-3-Clause"),
        ("3-clause BSD", "BSD-3-Clause"),
        ("Simplified BSD", "BSD-2-Clause"),
        ("BSD 2-Clause License", "BSD-2-Clause"),
        ("GNU General Public License v3 (GPLv3)", "GPL-3.0"),
        ("GPLv2", "GPL-2.0"),
        ("GNU Lesser General Public License v2.1", "LGPL-2.1"),
        ("LGPLv3", "LGPL-3.0"),
        ("GNU Affero General Public License v3", "AGPL-3.0"),
        ("MPL 2.0", "MPL-2.0"),
        ("Mozilla Public License 2.0 (MPL 2.0)", "MPL-2.0"),
        ("ISC License (ISCL)", "ISC"),
        ("Boost Software License 1.0 (BSL-1.0)", "BSL-1.0"),
        ("CC0 1.0 Universal", "CC0-1.0"),
        ("The Unlicense (Unlicense)", "Unlicense"),
        ("zlib/libpng License", "Zlib"),
        ("GPL", "unknown"),
        ("Apache 1.1", "unknown"),
        ("Proprietary", "unknown"),
        ("Other/Proprietary License", "unknown"),
        ("", "unknown"),
        ("Public Domain", "unknown"),
    ],
)
def test_spdx_from_name(name, spdx):
    assert spdx_from_name(name) == spdx
