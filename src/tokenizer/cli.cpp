// dsv4 tokenize / detokenize: JSON-lines filters between text and token ids.
#include "tokenizer/cli.h"

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace dsv4::cli {

namespace {

constexpr const char* kTokenizeHelp = R"(usage: dsv4 tokenize --tokenizer FILE --jsonl [--add-bos] [--no-special]

Reads one JSON string per line on stdin and writes its token ids as one JSON array per line.

  --tokenizer FILE   tokenizer.json, or a directory holding one (BOS / EOS from tokenizer_config.json
                     beside it, if present)
  --jsonl            JSON-lines input and output (required; the only format)
  --add-bos          prepend the BOS id to every line
  --no-special       tokenize special-token strings in the text as plain text
)";

constexpr const char* kDetokenizeHelp = R"(usage: dsv4 detokenize --tokenizer FILE --jsonl [--skip-special]

Reads one JSON array of token ids per line on stdin and writes the decoded text as one JSON string per line.

  --tokenizer FILE   tokenizer.json, or a directory holding one
  --jsonl            JSON-lines input and output (required; the only format)
  --skip-special     leave special tokens (BOS, EOS, ...) out of the text
)";

struct Options {
  std::string tokenizer;
  bool jsonl = false, add_bos = false, no_special = false, skip_special = false, help = false;
};

Options parse(int argc, char** argv, bool tokenize) {
  Options o;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--tokenizer") {
      DSV4_CHECK(i + 1 < argc, "option --tokenizer needs a value");
      o.tokenizer = argv[++i];
    } else if (a == "--jsonl") {
      o.jsonl = true;
    } else if (a == "--help" || a == "-h") {
      o.help = true;
    } else if (tokenize && a == "--add-bos") {
      o.add_bos = true;
    } else if (tokenize && a == "--no-special") {
      o.no_special = true;
    } else if (!tokenize && a == "--skip-special") {
      o.skip_special = true;
    } else {
      fail(cat("unknown option '", a, "' (see --help)"));
    }
  }
  if (o.help) return o;
  DSV4_CHECK(!o.tokenizer.empty(), "missing required option --tokenizer FILE");
  DSV4_CHECK(o.jsonl, "missing --jsonl (JSON lines is the only supported format)");
  return o;
}

nlohmann::json parse_line(const std::string& line, size_t number) {
  try {
    return nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    fail(cat("stdin line ", number, ": invalid JSON: ", e.what()));
  }
}

}  // namespace

void tokenize_jsonl(const Tokenizer& tokenizer, std::istream& in, std::ostream& out, bool add_bos,
                    bool allow_special) {
  std::string line;
  for (size_t number = 1; std::getline(in, line); ++number) {
    const nlohmann::json value = parse_line(line, number);
    DSV4_CHECK(value.is_string(), "stdin line ", number, ": expected a JSON string, got ", value.type_name());
    const std::vector<int32_t> ids = tokenizer.encode(value.get<std::string>(), add_bos, allow_special);
    std::string text = "[";
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) text += ',';
      text += std::to_string(ids[i]);
    }
    text += "]\n";
    out << text;
    out.flush();
  }
}

void detokenize_jsonl(const Tokenizer& tokenizer, std::istream& in, std::ostream& out, bool skip_special) {
  std::string line;
  std::vector<int32_t> ids;
  for (size_t number = 1; std::getline(in, line); ++number) {
    const nlohmann::json value = parse_line(line, number);
    DSV4_CHECK(value.is_array(), "stdin line ", number, ": expected a JSON array of token ids, got ",
               value.type_name());
    ids.clear();
    for (size_t i = 0; i < value.size(); ++i) {
      const nlohmann::json& v = value[i];
      DSV4_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < tokenizer.vocab_size(),
                 "stdin line ", number, ": element ", i, " (", v.dump(), ") is not a token id in [0, ",
                 tokenizer.vocab_size(), ")");
      ids.push_back(int32_t(v.get<int64_t>()));
    }
    out << nlohmann::json(tokenizer.decode(ids, skip_special)).dump() << '\n';
    out.flush();
  }
}

int cmd_tokenize(int argc, char** argv) {
  const Options o = parse(argc, argv, true);
  if (o.help) {
    std::fputs(kTokenizeHelp, stdout);
    return 0;
  }
  const Tokenizer tokenizer = Tokenizer::from_file(o.tokenizer);
  std::ios::sync_with_stdio(false);
  tokenize_jsonl(tokenizer, std::cin, std::cout, o.add_bos, !o.no_special);
  return 0;
}

int cmd_detokenize(int argc, char** argv) {
  const Options o = parse(argc, argv, false);
  if (o.help) {
    std::fputs(kDetokenizeHelp, stdout);
    return 0;
  }
  const Tokenizer tokenizer = Tokenizer::from_file(o.tokenizer);
  std::ios::sync_with_stdio(false);
  detokenize_jsonl(tokenizer, std::cin, std::cout, o.skip_special);
  return 0;
}

}  // namespace dsv4::cli
