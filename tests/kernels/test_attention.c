#include "tests/kernels/ktest.h"
Test(kernels_x, placeholder) { cr_assert(kt_backend()); }
