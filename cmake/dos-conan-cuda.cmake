# Included by the config that Conan's CMakeDeps writes for dos built with cuda=True:
# dos::cuda's kernels call the CUDA runtime, which comes from the consumer's toolkit.
if(NOT TARGET CUDA::cudart)
  find_package(CUDAToolkit REQUIRED)
endif()
if(TARGET dos::cuda)
  set_property(TARGET dos::cuda APPEND PROPERTY INTERFACE_LINK_LIBRARIES CUDA::cudart)
endif()
