#include "harness/perplexity.h"

#include <cstdlib>
#include <regex>
#include <stdexcept>

namespace dsv4::test {

std::string tiny_model_dir() { return source_path("models/tiny"); }

CliResult perplexity(const std::string& text_file, const std::string& numerics, std::vector<std::string> extra) {
  return perplexity_on("cpu", text_file, numerics, std::move(extra));
}

CliResult perplexity_on(const std::string& backend, const std::string& text_file, const std::string& numerics,
                        std::vector<std::string> extra) {
  std::vector<std::string> args = {"perplexity", "-f", text_file, "--backend", backend, "--numerics", numerics};
  args.insert(args.end(), extra.begin(), extra.end());
  return run_cli(args, 120);
}

double report_field(const std::string& out, const std::string& label) {
  const size_t at = out.find(label);
  if (at == std::string::npos) throw std::runtime_error("no '" + label + "' in:\n" + out);
  return std::strtod(out.c_str() + out.find(':', at) + 1, nullptr);
}

std::string ppl_line(const std::string& out) { return out.substr(0, out.find('\n')); }

double ppl_of(const std::string& out) {
  std::smatch m;
  const std::string line = ppl_line(out);
  if (!std::regex_search(line, m, std::regex(R"(^perplexity ([0-9.]+) over [0-9]+ tokens)")))
    throw std::runtime_error("no perplexity line in:\n" + out);
  return std::stod(m[1]);
}

}  // namespace dsv4::test
