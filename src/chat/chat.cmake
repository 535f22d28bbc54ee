# dsv4_chat: the DeepSeek-V4 chat format — prompt encoder (messages + tools -> prompt text) and the incremental
# parser of generated text (reasoning / content / DSML tool calls). Included from the top-level CMakeLists.txt
# after dsv4_engine is defined.
add_library(dsv4_chat STATIC
  ${CMAKE_CURRENT_LIST_DIR}/py_json.cpp
  ${CMAKE_CURRENT_LIST_DIR}/chat_encoding.cpp
  ${CMAKE_CURRENT_LIST_DIR}/chat_parser.cpp
)
target_include_directories(dsv4_chat PUBLIC ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(dsv4_chat PUBLIC dsv4_engine nlohmann_json::nlohmann_json)
