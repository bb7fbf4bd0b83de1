"""Hand-written native kernels (GEMM, convolution, BLAS) that generated programs call by their C names."""
