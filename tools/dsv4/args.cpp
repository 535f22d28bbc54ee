#include "args.h"

#include <cstdint>
#include <cstdlib>

#include "core/error.h"

namespace dsv4::cli {

Args::Args(int argc, char** argv, int first, const std::set<std::string>& valued,
           const std::set<std::string>& switches) {
  for (int i = first; i < argc; ++i) {
    const std::string a = argv[i];
    if (valued.count(a)) {
      DSV4_CHECK(i + 1 < argc, "option ", a, " needs a value");
      values_[a] = argv[++i];
    } else if (switches.count(a)) {
      flags_.insert(a);
    } else {
      fail(cat("unknown option '", a, "' (see --help)"));
    }
  }
}

bool wants_help(int argc, char** argv) {
  for (int i = 2; i < argc; ++i)
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") return true;
  return false;
}

std::set<std::string> Args::options(std::initializer_list<std::set<std::string>> groups) {
  std::set<std::string> all;
  for (const auto& g : groups) all.insert(g.begin(), g.end());
  return all;
}

std::string Args::get(const std::string& name) const {
  const auto it = values_.find(name);
  DSV4_CHECK(it != values_.end(), "missing required option ", name);
  return it->second;
}

std::string Args::get(const std::string& name, const std::string& fallback) const {
  const auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

static int64_t parse_int(const std::string& text, const std::string& what) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  DSV4_CHECK(!text.empty() && end && *end == '\0' && errno == 0, what, ": '", text, "' is not an integer");
  return v;
}

int64_t Args::get_int(const std::string& name, int64_t fallback) const {
  return values_.count(name) ? parse_int(values_.at(name), name) : fallback;
}

double Args::get_double(const std::string& name, double fallback) const {
  if (!values_.count(name)) return fallback;
  const std::string& text = values_.at(name);
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  DSV4_CHECK(!text.empty() && end && *end == '\0', name, ": '", text, "' is not a number");
  return v;
}

std::vector<int32_t> Args::get_ids(const std::string& name) const {
  const std::string text = get(name);
  std::vector<int32_t> ids;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const int64_t v = parse_int(item, name);
    DSV4_CHECK(v >= 0 && v <= INT32_MAX, name, ": token id ", v, " is negative or too large");
    ids.push_back(int32_t(v));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  DSV4_CHECK(!ids.empty(), name, ": no token ids given");
  return ids;
}

}  // namespace dsv4::cli
