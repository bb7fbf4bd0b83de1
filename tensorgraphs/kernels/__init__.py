"""Hand-written native kernels (GEMM, convolution, BLAS, fused attention) that generated programs call by their C
names."""
