"""Conan 2 recipe for dtrain, a header-only C++20 training library.

The package is dtrain's own CMake install: headers plus the installed
dtrain-config.cmake, which defines dtrain::dtrain and finds the dependencies
itself (cmake/DtrainDependencies.cmake). CMakeDeps therefore generates no
config for dtrain (cmake_find_mode "none"); the package's config folder is a
build dir, which CMakeToolchain puts on CMAKE_PREFIX_PATH, so a consumer's
find_package(dtrain CONFIG) finds it. docs/packaging.md explains the choice.

Dependencies: range-v3 and nlohmann_json come from Conan (ConanCenter, or the
system through a profile's [platform_requires]). Gloo, OpenBLAS, and with
with_cuda=True the CUDA toolkit and NCCL, are system requirements: ConanCenter
has no Gloo, and OpenBLAS must be the one Gloo and FindBLAS see.
"""

import os
import re
import shutil

from conan import ConanFile
from conan.errors import ConanException, ConanInvalidConfiguration
from conan.tools.build import check_min_cppstd
from conan.tools.cmake import CMake, CMakeDeps, CMakeToolchain, cmake_layout
from conan.tools.files import copy, load
from conan.tools.system.package_manager import Apt

required_conan_version = ">=2.0.5"


def _cuda_roots():
    """Where a CUDA toolkit may live, in the order FindCUDAToolkit looks."""
    roots = [os.environ.get(v) for v in ("CUDAToolkit_ROOT", "CUDA_PATH", "CUDA_HOME")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    roots.append("/usr/local/cuda")
    return [r for r in roots if r]


class DtrainConan(ConanFile):
    name = "dtrain"
    license = "Apache-2.0"
    description = "Header-only C++20 multi-GPU and multi-process training (DDP over NCCL or Gloo)"
    topics = ("deep-learning", "distributed-training", "cuda", "nccl", "gloo", "header-only")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    options = {"with_cuda": [True, False], "with_torch": [True, False]}
    default_options = {"with_cuda": False, "with_torch": False}
    # Header-only: one package for every configuration; with_cuda only checks the
    # system, since the consumer's find_package(dtrain) decides (DTRAIN_CUDA).
    implements = ["auto_header_only"]
    exports_sources = "CMakeLists.txt", "LICENSE", "cmake/*", "include/*"
    no_copy_source = True

    def set_version(self):
        # The one source of the version: the three #defines in version.hpp.
        text = load(self, os.path.join(self.recipe_folder, "include", "dtrain", "version.hpp"))
        parts = [re.search(rf"^#define DTRAIN_VERSION_{p} (\d+)$", text, re.M) for p in ("MAJOR", "MINOR", "PATCH")]
        if not all(parts):
            raise ConanException("include/dtrain/version.hpp lacks a DTRAIN_VERSION_MAJOR/MINOR/PATCH #define")
        self.version = ".".join(m.group(1) for m in parts)

    def layout(self):
        cmake_layout(self)

    def requirements(self):
        # A header-library's requirements reach its consumers' headers and links.
        self.requires("range-v3/[>=0.11.0 <1]")
        self.requires("nlohmann_json/[>=3.10.0 <4]")

    def validate(self):
        check_min_cppstd(self, 20)
        if self.settings.os != "Linux":
            raise ConanInvalidConfiguration("dtrain is built and tested on Linux only (Gloo over TCP, dtrain-run)")
        if self.options.with_cuda:
            self._check_cuda()
        if self.options.with_torch:
            self._check_torch()

    def _check_torch(self):
        """with_torch=True: LibTorch (its CMake package Torch) must already be installed; the consumer's
        find_package(dtrain) then defines dtrain::torch (DTRAIN_TORCH=AUTO, or ON to require it)."""
        dirs = [os.environ.get("Torch_DIR"), "/usr/lib/x86_64-linux-gnu/cmake/Torch", "/usr/lib/cmake/Torch"]
        dirs += [os.path.join(p, "Torch") for p in os.environ.get("CMAKE_PREFIX_PATH", "").split(os.pathsep) if p]
        if not any(d and os.path.isfile(os.path.join(d, "TorchConfig.cmake")) for d in dirs):
            raise ConanInvalidConfiguration(
                "dtrain/*:with_torch=True needs LibTorch, which Conan does not provide; no TorchConfig.cmake was "
                "found. Install Debian's libtorch-dev, or PyPI's torch and set CMAKE_PREFIX_PATH to "
                "python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)', or use with_torch=False")

    def _check_cuda(self):
        """with_cuda=True: the CUDA toolkit and NCCL must already be installed."""
        roots = _cuda_roots()
        toolkit = next((r for r in roots if os.path.isfile(os.path.join(r, "include", "cuda_runtime.h"))), None)
        if toolkit is None:
            raise ConanInvalidConfiguration(
                "dtrain/*:with_cuda=True needs the CUDA toolkit (nvcc, cudart, cuBLAS), which Conan does not "
                f"provide; none was found in {roots}. Install it (e.g. to /usr/local/cuda), put its bin/ on PATH "
                "or set CUDA_PATH, or use with_cuda=False")
        nccl_dirs = [os.environ.get("NCCL_ROOT"), toolkit, "/usr"]
        if not any(d and os.path.isfile(os.path.join(d, "include", "nccl.h")) for d in nccl_dirs):
            raise ConanInvalidConfiguration(
                "dtrain/*:with_cuda=True needs NCCL (nccl.h and libnccl), which Conan does not provide; none was "
                f"found under {[d for d in nccl_dirs if d]}. Install NCCL (e.g. the libnccl-dev package or "
                "NVIDIA's tarball) and set NCCL_ROOT if it is elsewhere, or use with_cuda=False")

    def system_requirements(self):
        # Checked (not installed) unless tools.system.package_manager:mode=install;
        # a missing package fails here with its name. Only apt systems are known.
        Apt(self).install(["libgloo-dev", "libopenblas-dev", "libssl-dev"])

    def generate(self):
        tc = CMakeToolchain(self)
        # Only the install is wanted: headers and the package config. CUDA is
        # decided by each consumer's find_package(dtrain), not here.
        tc.cache_variables.update({
            "DTRAIN_BUILD_TESTS": False,
            "DTRAIN_BUILD_EXAMPLES": False,
            "DTRAIN_BUILD_BENCH": False,
            "DTRAIN_BUILD_TOOLS": False,
            "DTRAIN_CUDA": "OFF",
            "DTRAIN_TORCH": "OFF",
        })
        tc.generate()
        CMakeDeps(self).generate()

    def build(self):
        cmake = CMake(self)
        cmake.configure()
        cmake.build()

    def package(self):
        copy(self, "LICENSE", self.source_folder, os.path.join(self.package_folder, "licenses"))
        CMake(self).install()

    def package_info(self):
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        # dtrain's installed config defines dtrain::dtrain and finds Gloo,
        # OpenBLAS, Threads, CUDA and NCCL; CMakeDeps must not write a second one.
        self.cpp_info.set_property("cmake_find_mode", "none")
        self.cpp_info.set_property("cmake_file_name", "dtrain")
        self.cpp_info.set_property("cmake_target_name", "dtrain::dtrain")
        self.cpp_info.builddirs = [os.path.join("share", "cmake", "dtrain")]
        # For generators other than CMake (not tested): the system libraries the
        # CMake config would link.
        self.cpp_info.system_libs = ["gloo", "openblas", "crypto", "pthread", "dl"]
