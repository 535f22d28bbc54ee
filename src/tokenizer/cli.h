// The `dsv4 tokenize` and `dsv4 detokenize` subcommands (argv[1] is the command name, options follow),
// plus their stream-level cores, which the tests drive with string streams.
#pragma once

#include <iosfwd>

namespace dsv4 {
class Tokenizer;
}

namespace dsv4::cli {

// dsv4 tokenize --tokenizer FILE --jsonl [--add-bos] [--no-special]
//   stdin: one JSON string per line; stdout: one JSON array of ids per line.
int cmd_tokenize(int argc, char** argv);
// dsv4 detokenize --tokenizer FILE --jsonl [--skip-special]
//   stdin: one JSON array of ids per line; stdout: one JSON string per line.
int cmd_detokenize(int argc, char** argv);

// Line-by-line cores. An invalid line throws Error naming its (1-based) line number; lines before it have
// already been written.
void tokenize_jsonl(const Tokenizer& tokenizer, std::istream& in, std::ostream& out, bool add_bos,
                    bool allow_special);
void detokenize_jsonl(const Tokenizer& tokenizer, std::istream& in, std::ostream& out, bool skip_special);

}  // namespace dsv4::cli
