// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// go:build ignore

/* Only the limits of the datapath (enum limit, bpf/include/common.h), for
 * internal/datapath/limits: the API, the controller and the agent take them
 * from there without loading the datapath's programs. */
#include "common.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* Keeps enum limit in BTF, for bpf2go -type limit. */
const enum limit *unused_limit __attribute__((unused));
