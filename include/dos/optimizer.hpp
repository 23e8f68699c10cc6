#pragma once
/// @file
/// @brief Umbrella header: everything a training engine needs to drive dos from the
///        host. Never includes CUDA.

#include "dos/backend/cpu.hpp"
#include "dos/config.hpp"
#include "dos/core/float16.hpp"
#include "dos/core/tensor.hpp"
#include "dos/cpu/cpu_adam.hpp"
#include "dos/cpu/simd.hpp"
#include "dos/cpu/thread_pool.hpp"
#include "dos/error.hpp"
#include "dos/interleaved_optimizer.hpp"
#include "dos/memory/host_resource.hpp"
#include "dos/optim/adam.hpp"
#include "dos/optim/param_group.hpp"
#include "dos/options.hpp"
#include "dos/partition/greedy_partitioner.hpp"
#include "dos/partition/subgroup.hpp"
#include "dos/version.hpp"
