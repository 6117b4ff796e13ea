// Marks a function nvcc compiles for the host and the device alike; plain C++ elsewhere.
#pragma once

#if defined(__CUDACC__)
#define TETRA_HOST_DEVICE __host__ __device__
#else
#define TETRA_HOST_DEVICE
#endif
