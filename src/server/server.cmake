# dsv4_server: the OpenAI- and Anthropic-compatible HTTP server (included from the top-level CMakeLists.txt after
# the dsv4 executable): transport (cpp-httplib from Debian's libcpp-httplib-dev, found through pkg-config), API schemas,
# the API <-> queue service, metrics and the dashboard, whose page is compiled in. The scheduler it drives is part
# of dsv4_engine.
find_package(PkgConfig REQUIRED)
pkg_check_modules(CPP_HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)

set(DSV4_DASHBOARD_PAGE ${CMAKE_BINARY_DIR}/generated/dashboard_page.cpp)
add_custom_command(
  OUTPUT ${DSV4_DASHBOARD_PAGE}
  COMMAND ${CMAKE_COMMAND} -DPAGE=${CMAKE_CURRENT_LIST_DIR}/dashboard.html -DOUT=${DSV4_DASHBOARD_PAGE}
          -DNAME=kDashboardPage -P ${CMAKE_CURRENT_LIST_DIR}/embed_page.cmake
  DEPENDS ${CMAKE_CURRENT_LIST_DIR}/dashboard.html ${CMAKE_CURRENT_LIST_DIR}/embed_page.cmake
  COMMENT "Embedding the dashboard page")

add_library(dsv4_server STATIC
  ${CMAKE_CURRENT_LIST_DIR}/openai_api.cpp
  ${CMAKE_CURRENT_LIST_DIR}/anthropic_api.cpp
  ${CMAKE_CURRENT_LIST_DIR}/output_decoder.cpp
  ${CMAKE_CURRENT_LIST_DIR}/completion_service.cpp
  ${CMAKE_CURRENT_LIST_DIR}/metrics.cpp
  ${CMAKE_CURRENT_LIST_DIR}/dashboard.cpp
  ${DSV4_DASHBOARD_PAGE}
  ${CMAKE_CURRENT_LIST_DIR}/http_server.cpp
)
target_link_libraries(dsv4_server PUBLIC dsv4_engine dsv4_tokenizer dsv4_chat PRIVATE PkgConfig::CPP_HTTPLIB)

target_sources(dsv4 PRIVATE ${PROJECT_SOURCE_DIR}/tools/dsv4/cmd_serve.cpp)
target_link_libraries(dsv4 PRIVATE dsv4_server)
