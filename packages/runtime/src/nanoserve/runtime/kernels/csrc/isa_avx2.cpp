// The kernels for AVX2 with FMA and F16C: Intel since Haswell, AMD since Zen 1.
// Only this file's functions carry the target; nothing from torch is compiled here.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#include <limits>

#include "kernel_table.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi,bmi2")
namespace nanoserve::avx2 {
#define NS_AVX2 1
#define NS_ROW_TILE 4
#define NS_ISA_NAME "avx2"
#include "simd.h"
#include "recurrent.h"
#include "kernels.h"
}  // namespace nanoserve::avx2
#pragma GCC pop_options

namespace nanoserve {
const KernelTable kAvx2Table = avx2::table;
}
