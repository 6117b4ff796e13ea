// Errors: one exception type whose message is one clear sentence for the user.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace tetra {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Concatenates its arguments with operator<< into one message.
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  throw Error(str_cat(args...));
}

}  // namespace tetra

// Checks an invariant or an input; on failure throws tetra::Error with the message.
#define TETRA_CHECK(cond, ...)          \
  do {                                  \
    if (!(cond)) ::tetra::fail(__VA_ARGS__); \
  } while (0)
