# Constrained decoding benchmark: token-mask cost per decode step at batch 16 (included from the top-level
# CMakeLists.txt after src/server/server.cmake).
add_executable(bench_grammar ${CMAKE_CURRENT_LIST_DIR}/bench_grammar.cpp)
target_include_directories(bench_grammar PRIVATE ${PROJECT_SOURCE_DIR}/tests)
target_link_libraries(bench_grammar PRIVATE dsv4_server dsv4_tokenizer_zlib)
target_compile_definitions(bench_grammar PRIVATE
  DSV4_TOKENIZER_DATA_DIR="${PROJECT_SOURCE_DIR}/tests/data/tokenizer"
  DSV4_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
