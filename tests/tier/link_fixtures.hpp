#pragma once
// Link numbers written out for the plan and cost-model tests, so their expectations do not move
// when a built-in profile is re-measured. Figures from ../shared/HARDWARE.md.
#include "tier/link.hpp"

namespace ght::tier::test {

inline LinkNumbers fixture_numbers(const char* name, LinkKind kind, double h2d, double d2h,
                                   double bidir, double kread, double kwrite, double triad,
                                   double hbm) {
  LinkNumbers l;
  l.name = name;
  l.source = "test";
  l.kind = kind;
  l.h2d_bps = h2d;
  l.d2h_bps = d2h;
  l.bidir_bps = bidir;
  l.kernel_read_bps = kread;
  l.kernel_write_bps = kwrite;
  l.host_triad_bps = triad;
  l.hbm_bps = hbm;
  return l;
}

inline LinkNumbers gh200_numbers() {
  return fixture_numbers("gh200-test", LinkKind::c2c, 375e9, 297e9, 600e9, 342e9, 297e9, 486e9,
                         3.4e12);
}

inline LinkNumbers pcie_numbers() {
  return fixture_numbers("pcie-test", LinkKind::pcie, 55.4e9, 55.3e9, 99.8e9, 51.3e9, 52.6e9,
                         111e9, 4.43e12);
}

}  // namespace ght::tier::test
