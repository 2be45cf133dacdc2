# Stands in for Dawn's CMake package: ExecuTorch's WebGPU backend asks
# find_package(Dawn) and links dawn::webgpu_dawn; this names wgpu-native (the
# library inside the `wgpu` wheel) instead. build.sh copies this file into the
# build folder beside lib/libwgpu_native.so, include/wgpu-native/{webgpu,wgpu}.h
# (wgpu-native's own headers) and include/webgpu/webgpu.h (edgeplug's
# compatibility header, which includes wgpu-native's and fills its gaps).
set(_edgeplug_dawn_root "${CMAKE_CURRENT_LIST_DIR}")
set(_edgeplug_wgpu_lib "${_edgeplug_dawn_root}/lib/libwgpu_native.so")
if(NOT EXISTS "${_edgeplug_wgpu_lib}"
   OR NOT EXISTS "${_edgeplug_dawn_root}/include/webgpu/webgpu.h"
   OR NOT EXISTS "${_edgeplug_dawn_root}/include/wgpu-native/webgpu.h")
  set(Dawn_FOUND FALSE)
  set(Dawn_NOT_FOUND_MESSAGE
      "edgeplug's stand-in for Dawn in ${_edgeplug_dawn_root} is incomplete: rerun tools/webgpu-runtime/build.sh")
  return()
endif()
if(NOT TARGET dawn::webgpu_dawn)
  add_library(dawn::webgpu_dawn SHARED IMPORTED)
  # wgpu-native's library has no SONAME: link it by name and find it again at run time through the rpath
  set_target_properties(
    dawn::webgpu_dawn
    PROPERTIES IMPORTED_LOCATION "${_edgeplug_wgpu_lib}"
               IMPORTED_NO_SONAME TRUE
               INTERFACE_INCLUDE_DIRECTORIES "${_edgeplug_dawn_root}/include"
               INTERFACE_LINK_OPTIONS "LINKER:-rpath,${_edgeplug_dawn_root}/lib"
  )
endif()
set(Dawn_FOUND TRUE)
