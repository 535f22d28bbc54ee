# Tokenizer benchmark (include from the top-level CMakeLists.txt after src/tokenizer/tokenizer.cmake).
add_executable(bench_tokenizer ${CMAKE_CURRENT_LIST_DIR}/bench_tokenizer.cpp)
target_include_directories(bench_tokenizer PRIVATE ${PROJECT_SOURCE_DIR}/tests)
target_link_libraries(bench_tokenizer PRIVATE dsv4_tokenizer dsv4_tokenizer_zlib)
target_compile_definitions(bench_tokenizer PRIVATE
  DSV4_TOKENIZER_DATA_DIR="${PROJECT_SOURCE_DIR}/tests/data/tokenizer")
