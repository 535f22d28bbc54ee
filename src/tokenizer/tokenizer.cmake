# dsv4_tokenizer: byte-level BPE tokenizer loaded from tokenizer.json, and the tokenize / detokenize CLI
# commands. Included from the top-level CMakeLists.txt after dsv4_engine is defined.
# Unicode classes come from PCRE2 (Debian: libpcre2-dev); the static library is preferred so that the
# binaries run on machines without the shared one.
find_path(DSV4_PCRE2_INCLUDE_DIR pcre2.h)
find_library(DSV4_PCRE2_LIBRARY NAMES libpcre2-8.a pcre2-8)
if(NOT DSV4_PCRE2_INCLUDE_DIR OR NOT DSV4_PCRE2_LIBRARY)
  message(FATAL_ERROR "PCRE2 not found: install it with 'apt-get install libpcre2-dev'")
endif()

add_library(dsv4_tokenizer STATIC
  ${CMAKE_CURRENT_LIST_DIR}/utf8.cpp
  ${CMAKE_CURRENT_LIST_DIR}/regex.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pretokenizer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/added_tokens.cpp
  ${CMAKE_CURRENT_LIST_DIR}/bpe.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cli.cpp
)
target_include_directories(dsv4_tokenizer PUBLIC ${PROJECT_SOURCE_DIR}/src)
target_include_directories(dsv4_tokenizer PRIVATE ${DSV4_PCRE2_INCLUDE_DIR})
target_link_libraries(dsv4_tokenizer PUBLIC dsv4_engine nlohmann_json::nlohmann_json PRIVATE ${DSV4_PCRE2_LIBRARY})

# zlib for the gzip'd test fixtures (tests/tokenizer, bench/tokenizer only), static when available.
find_library(DSV4_ZLIB_STATIC NAMES libz.a)
add_library(dsv4_tokenizer_zlib INTERFACE)
if(DSV4_ZLIB_STATIC)
  target_link_libraries(dsv4_tokenizer_zlib INTERFACE ${DSV4_ZLIB_STATIC})
else()
  find_package(ZLIB REQUIRED)
  target_link_libraries(dsv4_tokenizer_zlib INTERFACE ZLIB::ZLIB)
endif()
