// Errors for the whole engine: one typed exception, a message builder and the check macros.
// The CLI and the server turn an Error into a one-line message; nothing in the engine aborts on bad input.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace dsv4 {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Concatenates anything streamable: cat("tensor '", name, "' has ", n, " rows").
template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

[[noreturn]] inline void fail(const std::string& message) { throw Error(message); }

}  // namespace dsv4

// User-facing check: the message names the file / tensor / field and what was expected.
#define DSV4_CHECK(cond, ...)                                \
  do {                                                       \
    if (!(cond)) ::dsv4::fail(::dsv4::cat(__VA_ARGS__));     \
  } while (0)

// Internal invariant: a failure here is a bug in dsv4, so the message carries the statement and location.
#define DSV4_ASSERT(cond)                                                                       \
  do {                                                                                          \
    if (!(cond))                                                                                \
      ::dsv4::fail(::dsv4::cat("internal error: ", #cond, " failed at ", __FILE__, ":", __LINE__)); \
  } while (0)
