# Optional CUDA and NCCL detection. The build passes with and without them:
# CUDA is never listed in project(LANGUAGES), and every CUDA target is gated on
# TANDEM_HAVE_CUDA / TANDEM_HAVE_NCCL.
set(TANDEM_HAVE_CUDA OFF)
set(TANDEM_HAVE_NCCL OFF)
if(TANDEM_ENABLE_CUDA)
  include(CheckLanguage)
  set(TANDEM_CUDA_ROOT /usr/local/cuda CACHE PATH "CUDA root to try when nvcc is not on PATH")
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX}
     AND EXISTS ${TANDEM_CUDA_ROOT}/bin/nvcc)
    set(CMAKE_CUDA_COMPILER ${TANDEM_CUDA_ROOT}/bin/nvcc)
  endif()
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    # H100/H200 SASS plus compute_90 PTX; never `native` (CI has no GPU).
    set(CMAKE_CUDA_ARCHITECTURES "90a-real;90-virtual")
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
    find_package(CUDAToolkit)
    if(CUDAToolkit_FOUND)
      set(TANDEM_HAVE_CUDA ON)
      find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
      find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
      if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
        add_library(NCCL::nccl UNKNOWN IMPORTED)
        set_target_properties(NCCL::nccl PROPERTIES
          IMPORTED_LOCATION "${NCCL_LIBRARY}"
          INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
        set(TANDEM_HAVE_NCCL ON)
      endif()
    endif()
  endif()
endif()
message(STATUS "tandem: CUDA ${TANDEM_HAVE_CUDA}, NCCL ${TANDEM_HAVE_NCCL}")
