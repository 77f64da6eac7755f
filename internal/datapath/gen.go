// Package datapath loads the mptcp-operator BPF programs, attaches them to a
// node's interfaces and gives the agent a typed view of their maps.
package datapath

// The objects are generated from bpf/ and committed, so building the agent
// needs no clang. `make generate-bpf` regenerates them; CI checks they match.
//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -mcpu=v3" -target bpfel -type flow_key -type subflow -type conn_key -type conn_alias -type conn -type endpoint_key -type endpoint -type rule -type nic -type path_nic -type path_stats -type mptcp_subtype_stats -type mptcp_subtype -type stat_id -type settings_value -type cidr_key -type path_state -type pod_stats -type port_range -type spread_mode -type rate_cfg -type rate_gcra -type table_head -type subflow_entry -type subflow_bucket -type police_entry -type police_bucket -type table_op -type table_seed_value -type table_result -type table_op_code -type table_id -type rate_key -type rate_bucket -type rate_window -type rate_subflow -type rate_mode -type rate_key_kind -type setting_flag -type rule_match -type rule_flag -type path_flag -type nic_flag -type rate_flag -type subflow_role -type closed_report -type liveness_pair -type liveness_peer -type peer_cidr_key -type peer_paths -type tunnel_hop_key -type tunnel_hop datapath ../../bpf/datapath.c -- -I../../bpf/include -I/usr/include/x86_64-linux-gnu
