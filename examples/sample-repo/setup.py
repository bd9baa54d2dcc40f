import os

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(HERE, "csrc")

sources = [
    "csrc/pybind.cpp",
    "csrc/cpu/box_iou_cpu.cpp",
    "csrc/cuda/roi_pool_cuda.cu",
    "csrc/cuda/elementwise_cuda.cu",
    "csrc/cuda/box_iou_cuda.cu",
    "csrc/cuda/softmax_cuda.cu",
]

setup(
    name="tinyops",
    version="0.1.0",
    ext_modules=[
        CUDAExtension(
            name="tinyops._ext",
            sources=sources,
            include_dirs=[CSRC, os.path.join(CSRC, "common", "cuda")],
            extra_compile_args={
                "cxx": ["-O3"],
                "nvcc": ["-O3", "--expt-relaxed-constexpr"],
            },
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
