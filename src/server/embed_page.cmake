# Writes a web page into a C++ source as a raw string literal, so that dsv4 serve carries it in its binary:
#   cmake -DPAGE=page.html -DOUT=page.cpp -DNAME=kPage -P embed_page.cmake
# defines `const std::string_view dsv4::server::NAME` with the page's bytes (declared in dashboard.h).
file(READ "${PAGE}" text)
set(delimiter "dsv4page")
string(FIND "${text}" ")${delimiter}\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${PAGE} contains ')${delimiter}\"', which would end the raw string literal early")
endif()
file(WRITE "${OUT}"
  "// Generated from ${PAGE} by embed_page.cmake: edit the page, not this file.\n"
  "#include <string_view>\n\n"
  "namespace dsv4::server {\n"
  "extern const std::string_view ${NAME};\n"
  "const std::string_view ${NAME} = R\"${delimiter}(${text})${delimiter}\";\n"
  "}  // namespace dsv4::server\n")
