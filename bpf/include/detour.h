/* Failover: a subflow whose path is down on this node travels another path
 * of its rule until its own comes back, and a subflow whose peer sends it
 * over another path answers over that path too.
 *
 * The 4-tuple never changes: the path is only the NIC (the mark's routing
 * table) a subflow's packets leave by, so moving a subflow needs no MPTCP
 * signalling, and the receiving node's nic_ingress marks an arrival with its
 * NIC's path, so strict reverse-path filtering accepts the moved subflow.
 * The node that sees the failure leads: it detours at once (the agent marks
 * a path down within milliseconds of losing its NIC's carrier). The peer,
 * whose own NIC on that path may look healthy, learns it from the wire:
 * pod_ingress follows the subflow onto the path its packets arrive over, so
 * the replies take the live path too. When the path comes back the leader
 * brings the subflow home and the peer follows it back.
 *
 * Arrivals are not authenticated: anyone on a fabric can send a packet with
 * a subflow's 4-tuple. So a node follows only when the path the subflow
 * travels now has been silent for DETOUR_SILENT_MS (a peer that moved sends
 * nothing over it any more; a forger cannot stop the real packets), never
 * within DETOUR_SETTLE_MS of the last move (no flapping, and the packets
 * still queued on the old path are not followed back), only onto a path the
 * subflow's rule lists, and a followed detour ends after
 * DETOUR_FOLLOW_MAX_MS: the node then goes home, and follows again
 * DETOUR_SILENT_MS later if the peer still leads. A SYN is never followed
 * (pod_ingress): a moved subflow sends none, and a flood of forged SYNs on
 * the other path would otherwise hold a quiet subflow there for as long as
 * it lasts. A subflow no rule selected is never moved.
 *
 * The state lives in the subflow's flags (SUBFLOW_DETOUR_* in common.h),
 * updated by compare-and-swap (the backup actor writes other bits of the
 * same word on another CPU), and in seen_ms and moved_ms. */

/* A few ticks of the coarse clock: a busy subflow's packets arrive every
 * few microseconds, so its silence means the peer moved; and short, because
 * until this node follows, the replies it sends over the dead path are lost
 * (duplicate ACKs among them: at 50 ms the sender fell back to its
 * retransmission timeout, 200 ms, in every e2e near-side failure). */
#define DETOUR_SILENT_MS 12
/* Longer than a detour's queue takes to drain (the bed's links queue at
 * most 20 ms; a data centre's switches far less) plus a round trip. */
#define DETOUR_SETTLE_MS 250
/* How long a followed detour lasts before this node tries home again: a
 * forged move of an idle subflow ends after it; a real one is followed
 * again DETOUR_SILENT_MS later, so a long failure of the peer's NIC costs
 * the follower that much every DETOUR_FOLLOW_MAX_MS (0.1 %). */
#define DETOUR_FOLLOW_MAX_MS 10000

/* now_ms is the coarse clock (a tick, 4 ms at HZ=250: plenty for these
 * thresholds, and cheaper than the precise one on every packet into a pod)
 * in milliseconds, wrapping. */
static __always_inline __u32 now_ms(void)
{
	return (__u32)(bpf_ktime_get_coarse_ns() / 1000000);
}

/* subflow_detour is the path a subflow currently travels instead of its own,
 * 0 for none. */
static __always_inline __u32 subflow_detour(const struct subflow *sf)
{
	__u32 path = subflow_path(sf);

	return path == sf->path_index ? 0 : path;
}

/* set_detour moves the subflow onto path (0: home), ours saying whether this
 * node leads. The detour bits and SUBFLOW_DETOUR_OURS change in one
 * compare-and-swap, so that two CPUs moving it at once leave one of their
 * values, never a mix; the backup actor's bits are kept. */
static __always_inline void set_detour(struct subflow *sf, __u32 path, __u32 ours)
{
	__u32 bits = ((path << SUBFLOW_DETOUR_SHIFT) & SUBFLOW_DETOUR_MASK) | ours;
	__u32 old, now = now_ms();

	for (int i = 0; i < 4; i++) {
		old = sf->flags;
		if (__sync_val_compare_and_swap(
			&sf->flags, old, (old & ~(SUBFLOW_DETOUR_MASK | SUBFLOW_DETOUR_OURS)) | bits) == old)
			break;
	}
	sf->moved_ms = now;
	sf->seen_ms = now;
}

/* detour_path is the first path of rule_id's list, other than home, that is
 * up here and not in down (the paths down towards the subflow's peer):
 * active paths first, then backup ones, as the list orders them.
 * 0 when there is none (or the subflow has no rule: a mirrored subflow of a
 * pod no rule selects only follows its peer). A global function: verified
 * once, called only when a path is down. */
__noinline __u32 detour_path(__u32 rule_id, __u32 home, __u32 down)
{
	struct rule *r = bpf_map_lookup_elem(&rules, &rule_id);
	__u32 npaths;

	if (!r)
		return 0;
	npaths = r->npaths;
	for (__u32 i = 0; i < MAX_PATHS; i++) {
		__u32 path;

		if (i >= npaths)
			break;
		path = rule_path(r, i);
		if (path != home && path_up_to(path, down))
			return path;
	}
	return 0;
}

/* rule_has_path says whether path is in rule_id's list. */
__noinline int rule_has_path(__u32 rule_id, __u32 path)
{
	struct rule *r = bpf_map_lookup_elem(&rules, &rule_id);
	__u32 npaths;

	if (!r)
		return 0;
	npaths = r->npaths;
	for (__u32 i = 0; i < MAX_PATHS; i++) {
		if (i >= npaths)
			break;
		if (rule_path(r, i) == path)
			return 1;
	}
	return 0;
}

/* travel_path is the path a packet of sf the pod sends leaves by; down are
 * the paths down towards the packet's destination alone (paths_down_to). */
static __always_inline __u32 travel_path(struct subflow *sf, __u32 down)
{
	__u32 home = sf->path_index & MAX_PATHS, flags = sf->flags;
	__u32 detour = subflow_detour(sf), alt;

	if (!path_up_to(home, down)) {
		if (detour && path_up_to(detour, down) && rule_has_path(sf->rule, detour)) {
			/* Already away (the peer led, or an earlier
			 * packet): this node now leads too. */
			if (!(flags & SUBFLOW_DETOUR_OURS))
				set_detour(sf, detour, SUBFLOW_DETOUR_OURS);
			return detour;
		}
		alt = detour_path(sf->rule, home, down);
		if (!alt)
			return home; /* nowhere to go: the kernel's own recovery */
		set_detour(sf, alt, SUBFLOW_DETOUR_OURS);
		count(STAT_SUBFLOW_DETOURED);
		return alt;
	}
	if (flags & SUBFLOW_DETOUR_OURS) {
		/* The path is back: home (the peer follows). */
		set_detour(sf, 0, 0);
		count(STAT_SUBFLOW_HOMED);
		return home;
	}
	if (!detour)
		return home;
	/* A followed detour: kept while its path is up here, still in the
	 * rule (an admin may have taken it out), and young. */
	if (path_up_to(detour, down) && now_ms() - sf->moved_ms < DETOUR_FOLLOW_MAX_MS &&
	    rule_has_path(sf->rule, detour))
		return detour;
	set_detour(sf, 0, 0);
	/* No settling: this is no answer to a move of the peer's, whose
	 * detour, if it still leads one, is followed again once home has
	 * been silent for DETOUR_SILENT_MS. */
	sf->moved_ms -= DETOUR_SETTLE_MS;
	return home;
}

/* follow_peer keeps a subflow on the path the peer sends it over. arrival is
 * the path the packet came in by (its mark, set by nic_ingress; 0 when not
 * marked: observe-only, or not from a path NIC). */
static __always_inline void follow_peer(struct subflow *sf, __u32 arrival)
{
	__u32 home = sf->path_index & MAX_PATHS, now, current;

	if (!arrival || arrival > MAX_PATHS || (sf->flags & SUBFLOW_DETOUR_OURS))
		return; /* not from a path NIC, or this node leads */
	now = now_ms();
	current = subflow_path(sf);
	if (arrival == current) {
		if (sf->seen_ms != now)
			sf->seen_ms = now;
		return;
	}
	/* The peer seems to have moved: believed only once the path the
	 * subflow travels now has gone quiet, not right after a move, and
	 * onto a path the subflow's rule lists. */
	if (sf->rule == RULE_NONE || now - sf->seen_ms < DETOUR_SILENT_MS ||
	    now - sf->moved_ms < DETOUR_SETTLE_MS)
		return;
	if (arrival != home && !rule_has_path(sf->rule, arrival))
		return;
	set_detour(sf, arrival == home ? 0 : arrival, 0);
	count(STAT_SUBFLOW_FOLLOWED);
}

/* arrival_path is the path nic_ingress marked a received packet with. */
static __always_inline __u32 arrival_path(const struct __sk_buff *skb)
{
	return (skb->mark & mark_mask) >> mark_shift;
}
