// Host check of compat.h's env_int (tools/compile_check.sh builds and runs it): prints the
// value read from MLA_EXT_TEST_ENV with default 5.
#include <stdio.h>

#include "mla_ext/compat.h"

int main() {
  printf("%ld\n", mla_ext::env_int("MLA_EXT_TEST_ENV", 5));
  return 0;
}
