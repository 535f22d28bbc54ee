# gemm family benchmarks (include from the top-level CMakeLists.txt). CUDA builds only.
if(DSV4_HAVE_CUDA)
  add_executable(bench_gemv ${CMAKE_CURRENT_LIST_DIR}/bench_gemv.cpp)
  target_link_libraries(bench_gemv PRIVATE dsv4_cuda)
endif()
