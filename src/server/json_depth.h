// Nesting depth of JSON values from clients and models, measured without recursion: copying,
// dumping or rendering a value recurses once per level, so a value nested 100,000 deep (a
// tool's `parameters`, say) must be refused before anything walks it.
#pragma once

#include <cstddef>
#include <vector>

namespace tetra::server {

inline constexpr size_t kMaxJsonNesting = 128;

// True when `root` has more than `max_depth` nested arrays/objects on some path.
template <class Json>
bool json_nested_deeper_than(const Json& root, size_t max_depth = kMaxJsonNesting) {
  if (!root.is_structured()) return false;
  struct Frame {
    const Json* node;
    typename Json::const_iterator next;
  };
  std::vector<Frame> stack{{&root, root.cbegin()}};
  while (!stack.empty()) {
    if (stack.size() > max_depth) return true;
    Frame& top = stack.back();
    if (top.next == top.node->cend()) {
      stack.pop_back();
      continue;
    }
    const Json& child = *top.next;
    ++top.next;
    if (child.is_structured()) stack.push_back({&child, child.cbegin()});
  }
  return false;
}

}  // namespace tetra::server
