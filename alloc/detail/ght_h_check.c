/* Compiled as C11 by alloc/CMakeLists.txt: ght/ght.h must stay usable from C. */
#define _POSIX_C_SOURCE 200809L
#include "ght/ght.h"

int ght_h_check(void);
int ght_h_check(void) {
  ght_placement p;
  p.tier = GHT_TIER_HOST;
  p.tensor_class = GHT_CLASS_MASTER;
  return p.tier + p.tensor_class + (int)sizeof(ght_stream_t);
}
