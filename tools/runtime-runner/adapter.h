// What the shared runner (runner.cpp) asks of its backend: the name of the GPU
// device the backend opened, for the runner's start line. Each runtime build
// gives its own adapter.cpp.
#pragma once

#include <string>

namespace edgeplug {

// e.g. "llvmpipe (LLVM 15.0.6, 256 bits)"; "no ... adapter (why)" when none opened
std::string adapter_name();

}  // namespace edgeplug
