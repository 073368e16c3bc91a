#include "common/openmp_wait.h"

#include <unistd.h>

#include <cstdlib>

namespace specstream {

void PreferPassiveOpenMpWait(char** argv, const char* exe) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  setenv("OMP_WAIT_POLICY", "PASSIVE", /*overwrite=*/1);
  execv(exe, argv);
}

}  // namespace specstream
