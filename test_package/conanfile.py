"""Builds and runs a small program against the dtrain package (conan create)."""

import os

from conan import ConanFile
from conan.tools.build import can_run
from conan.tools.cmake import CMake, CMakeToolchain, cmake_layout


class DtrainTestConan(ConanFile):
    settings = "os", "arch", "compiler", "build_type"
    generators = "CMakeDeps"
    test_type = "explicit"

    def requirements(self):
        self.requires(self.tested_reference_str)

    def layout(self):
        cmake_layout(self)

    def generate(self):
        tc = CMakeToolchain(self)
        # dtrain's package config reads DTRAIN_CUDA: what the package was asked
        # to check for is what this consumer links.
        with_cuda = self.dependencies["dtrain"].options.with_cuda
        tc.cache_variables["DTRAIN_CUDA"] = "ON" if with_cuda else "OFF"
        tc.generate()

    def build(self):
        cmake = CMake(self)
        cmake.configure()
        cmake.build()

    def test(self):
        if can_run(self):
            self.run(os.path.join(self.cpp.build.bindir, "test_package"), env="conanrun")
