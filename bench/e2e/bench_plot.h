// The roofline picture of a dsv4 bench run (dsv4 bench --plot FILE.svg), as a self-contained SVG: every decode
// row's measured step time against its floor (the bytes the step must move over the copy bandwidth), grouped by
// context depth, one colour per batch size, on a log scale, with the row's percentage of the floor; and the
// prefill throughput of every prompt length.
#pragma once

#include <string>

#include "e2e/bench_e2e.h"

namespace dsv4 {

std::string bench_svg(const BenchReport& report);

}  // namespace dsv4
