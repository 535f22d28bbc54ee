# MoE benchmarks (CUDA builds only): V4-Flash MoE decode against the copy bandwidth (bench_moe.cpp), and the
# expert kernels' weight loads alone in row and MMA tile order (bench_load_pattern.cu).
if(DSV4_HAVE_CUDA)
  add_executable(bench_moe ${CMAKE_CURRENT_LIST_DIR}/bench_moe.cpp)
  target_link_libraries(bench_moe PRIVATE dsv4_engine dsv4_bench_common)
  add_executable(bench_load_pattern ${CMAKE_CURRENT_LIST_DIR}/bench_load_pattern.cu)
  target_link_libraries(bench_load_pattern PRIVATE dsv4_cuda dsv4_bench_common)
endif()
