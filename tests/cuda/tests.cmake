# GPU tests: each op family of the CUDA backend against the CPU reference, and the CUDA backend end to end.
# Built in every configuration; without a GPU each test reports itself skipped.
add_library(dsv4_gpu_harness STATIC ${CMAKE_CURRENT_LIST_DIR}/gpu.cpp)
target_link_libraries(dsv4_gpu_harness PUBLIC dsv4_test_harness)

# dsv4_gpu_test(NAME src...)
function(dsv4_gpu_test name)
  dsv4_test(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE dsv4_gpu_harness)
endfunction()

# Each family's tests are compiled once (an object library) and linked twice: into cuda_test_<family>, registered
# with CTest, and into cuda_tests, every family in one binary. That one is what tools/gpu-build carries to the
# GPU machine: every test binary links all the kernels (a ~23 MB fatbin each) and the separate binaries do not fit
# the device tool's 64 MiB beside the tree even under xz (10.4 MB against ~9 MB of room, 2026-11-28).
file(GLOB DSV4_GPU_TEST_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/test_*.cpp)
set(DSV4_GPU_TEST_OBJECTS)
foreach(src ${DSV4_GPU_TEST_SOURCES})
  get_filename_component(name ${src} NAME_WE)
  add_library(cuda_${name}_objects OBJECT ${src})
  target_link_libraries(cuda_${name}_objects PRIVATE dsv4_engine dsv4_gpu_harness GTest::gtest)
  dsv4_gpu_test(cuda_${name} $<TARGET_OBJECTS:cuda_${name}_objects>)
  list(APPEND DSV4_GPU_TEST_OBJECTS $<TARGET_OBJECTS:cuda_${name}_objects>)
endforeach()
add_executable(cuda_tests ${DSV4_GPU_TEST_OBJECTS})
target_link_libraries(cuda_tests PRIVATE dsv4_engine dsv4_gpu_harness GTest::gtest_main)
add_dependencies(cuda_tests dsv4)
