// The kernels in plain C++, for any CPU: the reference the SIMD paths agree with bit for bit.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#include <limits>

#include "kernel_table.h"

namespace nanoserve::portable {
#define NS_PORTABLE 1
#define NS_ROW_TILE 4
#define NS_ISA_NAME "portable"
#include "simd.h"
#include "recurrent.h"
#include "kernels.h"
}  // namespace nanoserve::portable

namespace nanoserve {
const KernelTable kPortableTable = portable::table;
}
