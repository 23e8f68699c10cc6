"""Conan 2 recipe for dos.

    conan create . -pr <profile> [-o "dos/*:cuda=True"]

Header-only by default: one package for every configuration (package_id clears
settings). With cuda=True the package also holds dos::cuda, the CUDA backend's kernels,
a static library built with nvcc, so settings matter again.

The version is read from CMakeLists.txt's project(VERSION), the one place it is set.
"""
import os
import re

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration
from conan.tools.build import check_min_cppstd
from conan.tools.cmake import CMake, CMakeDeps, CMakeToolchain, cmake_layout
from conan.tools.files import copy, load, rmdir

required_conan_version = ">=2.0"


class DosConan(ConanFile):
    name = "dos"
    description = ("Deep Optimizer States: interleaved CPU/GPU Adam for offloaded optimizer state "
                   "(header-only C++20)")
    topics = ("deep-learning", "optimizer", "adam", "offloading", "header-only")
    settings = "os", "arch", "compiler", "build_type"
    options = {"cuda": [True, False]}
    default_options = {"cuda": False}
    # The sources CMake needs to configure and install dos; tests, examples and
    # benchmarks stay out of the package.
    exports_sources = "CMakeLists.txt", "cmake/*", "include/*"

    def set_version(self):
        text = load(self, os.path.join(self.recipe_folder, "CMakeLists.txt"))
        match = re.search(r"project\(\s*dos\s+VERSION\s+(\d+\.\d+\.\d+)", text)
        if not match:
            raise ConanInvalidConfiguration("dos: no project(dos VERSION x.y.z) in CMakeLists.txt")
        self.version = match.group(1)

    def configure(self):
        self.package_type = "static-library" if self.options.cuda else "header-library"

    def layout(self):
        cmake_layout(self)

    def requirements(self):
        # Tested with 9.1 (Debian 12's libfmt-dev); see the profile in
        # tests/packaging/conan_create.sh for taking it from the system.
        self.requires("fmt/[>=9.1 <10]", transitive_headers=True)

    def validate(self):
        check_min_cppstd(self, 20)
        if self.options.cuda and self.settings.os != "Linux":
            raise ConanInvalidConfiguration("dos: cuda=True is built and tested on Linux only")

    def package_id(self):
        if not self.info.options.cuda:
            self.info.clear()

    def generate(self):
        tc = CMakeToolchain(self)
        # dos's CMake asks for C++20 itself (compile features; -std=c++20 for nvcc). Conan's
        # CMAKE_CXX_STANDARD would also be demanded of the CUDA language, for which
        # CMake 3.25 knows no C++20 flag, and enabling CUDA would fail.
        tc.blocks.remove("cppstd")
        tc.cache_variables["DOS_BUILD_TESTS"] = False
        tc.cache_variables["DOS_BUILD_EXAMPLES"] = False
        tc.cache_variables["DOS_BUILD_BENCHMARKS"] = False
        tc.cache_variables["DOS_INSTALL"] = True
        tc.cache_variables["DOS_WITH_CUDA"] = bool(self.options.cuda)
        # cuda=True promises dos::cuda: fail rather than package without it.
        tc.cache_variables["DOS_REQUIRE_CUDA"] = bool(self.options.cuda)
        tc.generate()
        CMakeDeps(self).generate()

    def build(self):
        cmake = CMake(self)
        cmake.configure()
        cmake.build()

    def package(self):
        CMake(self).install()
        # Conan's CMakeDeps writes the consumers' config files from package_info();
        # dos's own CMake package and dos.pc would only compete with them.
        rmdir(self, os.path.join(self.package_folder, "lib", "cmake"))
        rmdir(self, os.path.join(self.package_folder, "share"))
        copy(self, "dos-conan-*.cmake", os.path.join(self.source_folder, "cmake"),
             os.path.join(self.package_folder, "lib", "cmake"))

    def package_info(self):
        self.cpp_info.set_property("cmake_file_name", "dos")
        self.cpp_info.set_property("pkg_config_name", "dos")
        core = self.cpp_info.components["core"]
        core.set_property("cmake_target_name", "dos::dos")
        # A profile may take {fmt} from the system ([platform_requires] fmt/9.1.0, as
        # tests/packaging/conan_create.sh does): Conan then hides it from
        # self.dependencies and CMakeDeps writes nothing for it, so the build module
        # finds the system's {fmt} and links it.
        if self._fmt_from_conan():
            core.requires = ["fmt::fmt"]
        modules = [os.path.join("lib", "cmake", "dos-conan-fmt.cmake")]
        core.bindirs = []
        core.libdirs = []
        if self.options.cuda:
            cuda = self.cpp_info.components["cuda"]
            cuda.set_property("cmake_target_name", "dos::cuda")
            cuda.libs = ["dos_cuda"]
            cuda.defines = ["DOS_WITH_CUDA_TOOLKIT"]
            cuda.requires = ["core"]
            # The CUDA runtime comes from the consumer's toolkit, not from Conan: this
            # module finds it and links CUDA::cudart to dos::cuda.
            modules.append(os.path.join("lib", "cmake", "dos-conan-cuda.cmake"))
        self.cpp_info.set_property("cmake_build_modules", modules)

    def _fmt_from_conan(self):
        try:
            self.dependencies["fmt"]
        except KeyError:
            return False
        return True
