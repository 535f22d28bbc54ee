# Attention family benchmark: decode attention and the lightning indexer at V4-Flash shapes against the HBM
# floor (include from the top-level CMakeLists.txt; CUDA builds only).
if(DSV4_HAVE_CUDA)
  add_executable(bench_attention ${CMAKE_CURRENT_LIST_DIR}/bench_attention.cpp)
  target_link_libraries(bench_attention PRIVATE dsv4_cuda dsv4_bench_common)
endif()
