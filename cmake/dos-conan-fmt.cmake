# Included by the config that Conan's CMakeDeps writes for dos. Where the profile takes
# {fmt} from the system ([platform_requires]), CMakeDeps defines no fmt::fmt and does not
# link it to dos::dos: find the system's and link it. With {fmt} from Conan this only
# repeats a link CMakeDeps already made.
if(NOT TARGET fmt::fmt)
  find_package(fmt CONFIG REQUIRED)
endif()
if(NOT TARGET Threads::Threads)
  find_package(Threads REQUIRED)
endif()
set_property(TARGET dos::dos APPEND PROPERTY INTERFACE_LINK_LIBRARIES fmt::fmt Threads::Threads)
