// The build's version, for `tetra --version` and the server's GET /version.
#include "commands.h"

namespace tetra::cli {

// TETRA_VERSION and TETRA_GIT_COMMIT come from CMake's configure step (apps/tetra/CMakeLists.txt).
std::string version_string() {
  const std::string commit = TETRA_GIT_COMMIT;
  return commit.empty() ? std::string(TETRA_VERSION) : std::string(TETRA_VERSION) + " (commit " + commit + ")";
}

}  // namespace tetra::cli
