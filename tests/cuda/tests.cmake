# GPU tests: each op family of the CUDA backend against the CPU reference, and the CUDA backend end to end.
# Built in every configuration; without a GPU each test reports itself skipped.
add_library(dsv4_gpu_harness STATIC ${CMAKE_CURRENT_LIST_DIR}/gpu.cpp)
target_link_libraries(dsv4_gpu_harness PUBLIC dsv4_test_harness)

# dsv4_gpu_test(NAME src...)
function(dsv4_gpu_test name)
  dsv4_test(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE dsv4_gpu_harness)
endfunction()

file(GLOB DSV4_GPU_TEST_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/test_*.cpp)
foreach(src ${DSV4_GPU_TEST_SOURCES})
  get_filename_component(name ${src} NAME_WE)
  dsv4_gpu_test(cuda_${name} ${src})
endforeach()
