/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Hash tables the programs look up inline, for the lookups every packet
 * makes (a subflow by its 4-tuple, a police bucket by its key).
 *
 * Why not a BPF hash map: its lookup is a chain of calls into the kernel
 * (hash, bucket walk, memcmp), and on CPUs whose returns are mitigated
 * (SRSO safe-RET, retpolines) each return is expensive; a lookup cost about
 * 40 ns there. An array map's lookup is inlined by the verifier, so a table
 * built on one costs a hash, one inlined lookup and a few compares: about
 * 8 ns (docs/benchmarks.md).
 *
 * Layout: an array map of 2^bits buckets; a bucket is a struct table_head
 * and TABLE_WAYS entries, each a key then a value, both whole 64-bit words.
 * A key goes in the bucket its hash names, in any way; the way's tag, a
 * part of the hash with TABLE_TAG_LIVE set, says it is live, so a lookup
 * compares keys only where the tag matches.
 *
 * Writers claim a way by compare-and-swap of its tag to TABLE_TAG_BUSY,
 * write it, and publish it by swapping in its tag. Lookups pass busy ways
 * over (a packet of a subflow being written is, for that instant, a packet
 * of no known subflow), so no reader sees a half-written entry it claims.
 * User space changes a table only through the table_ctl program, which
 * uses these same functions.
 *
 * Like the kernel's preallocated LRU hash maps, whose elements are reused
 * at once, a reader that found an entry just before it was evicted may act
 * on the entry that replaced it, for that one packet; entries are evicted
 * only when their bucket is full. x86's store ordering keeps a reader that
 * sees a published tag from reading the key written before it; on weaker
 * architectures the key compare may miss, never match a stale key.
 *
 * Eviction: when a bucket is full, an insert evicts a way not found by a
 * lookup since the bucket's last eviction (each lookup sets its way's bit in
 * head.used), else the way at the bucket's rotating hand; then every way
 * starts over as unused (not-recently-used, per bucket).
 *
 * The hash is multilinear, keyed by table_seed, random per node and kept
 * with the pinned maps: a peer that chooses its ports cannot aim at a bucket
 * to evict other subflows without knowing the seed. */
#pragma once

#include "common.h"

#define TABLE_WAYS	      4
#define TABLE_TAG_EMPTY	      0
#define TABLE_TAG_BUSY	      1		  /* being written: lookups pass it over */
#define TABLE_TAG_LIVE	      0x80000000U /* set in every live way's tag */
#define TABLE_KEY_WORDS_MAX   5
#define TABLE_VALUE_WORDS_MAX 10
#define TABLE_SEED_WORDS      (TABLE_KEY_WORDS_MAX + 1)
#define TABLE_INSERT_ATTEMPTS 2

struct table_head {
	__u32 tag[TABLE_WAYS]; /* TABLE_TAG_EMPTY, _BUSY, or the live key's tag */
	__u32 used;	       /* bit w: way w was looked up since the bucket last evicted */
	__u32 hand;	       /* the way evicted next when every way was used */
	__u32 pad[2];
};

/* table_seed[0] is added, table_seed[1 + i] multiplies key word i. Set by
 * user space before the programs load (internal/datapath/table.go), the same
 * for every load that shares the pinned tables. */
volatile const __u64 table_seed[TABLE_SEED_WORDS] = {};

/* table_result and table_op_code pass between the agent and table_ctl of the
 * same object (bpf2go exports them to its Go) and are never stored: no two
 * releases meet through them, so they need not keep their numbers. */
enum table_result {
	TABLE_FAILED = 0,   /* contention, or a way of the bucket being written: not stored */
	TABLE_INSERTED = 1, /* a new entry in a free way */
	TABLE_REPLACED = 2, /* the key's entry, its value rewritten */
	TABLE_EVICTED = 3,  /* a new entry in place of another key's */
	TABLE_EXISTS = 4,   /* the key's entry, left as it was (no replace asked) */
};

/* table_op is one change user space asks of a table, through the table_ctl
 * program (the context it runs with): user space never writes a table's
 * buckets itself, so its changes claim ways as the programs' do. */
enum table_op_code {
	TABLE_OP_INSERT = 1,	 /* store, replacing the key's entry */
	TABLE_OP_INSERT_NEW = 2, /* store unless the key has an entry */
	TABLE_OP_DELETE = 3,	 /* free the key's entries */
	/* The subflow table only: the pod's kernel closed the key's subflow
	 * (datapath.c, subflow_closed); value[0] is when the close was heard,
	 * on bpf_ktime_get_ns' clock. */
	TABLE_OP_SUBFLOW_CLOSED = 4,
};

struct table_op {
	__u32 op;     /* enum table_op_code */
	__u32 table;  /* which table: enum table_id of the program */
	__s32 result; /* enum table_result for inserts, entries freed for deletes, -1: bad request */
	/* TABLE_OP_SUBFLOW_CLOSED: the path of the subflow it closed (its
	 * own, not a detour); read only when result says it freed one. */
	__u32 closed_path;
	__u64 key[TABLE_KEY_WORDS_MAX];
	__u64 value[TABLE_VALUE_WORDS_MAX];
};

/* table_hash is the key's 64-bit hash: the seeded multilinear sum of its
 * words (multipliers forced odd). The bucket is its top bits, the tag bits
 * below them, so the two are independent. */
static __always_inline __u64 table_hash(const __u64 *key, __u32 words)
{
	__u64 h = table_seed[0];

#pragma unroll
	for (int i = 0; i < TABLE_KEY_WORDS_MAX; i++) {
		if (i < words)
			h += key[i] * (table_seed[i + 1] | 1);
	}
	return h;
}

static __always_inline __u32 table_tag(__u64 h)
{
	return (__u32)(h >> 16) | TABLE_TAG_LIVE;
}

/* table_entry is way w of bucket b, entries of entry_words words. */
static __always_inline __u64 *table_entry(struct table_head *b, __u32 w, __u32 entry_words)
{
	return (__u64 *)((void *)(b + 1) + (w & (TABLE_WAYS - 1)) * entry_words * 8);
}

static __always_inline bool table_key_equal(const __u64 *a, const __u64 *b, __u32 words)
{
	__u64 diff = 0;

#pragma unroll
	for (int i = 0; i < TABLE_KEY_WORDS_MAX; i++) {
		if (i < words)
			diff |= a[i] ^ b[i];
	}
	return diff == 0;
}

/* table_fill writes key and value into entry e, whose way the caller holds
 * busy. */
static __always_inline void table_fill(__u64 *e, const __u64 *key, __u32 key_words, const __u64 *value,
				       __u32 value_words)
{
#pragma unroll
	for (int i = 0; i < TABLE_KEY_WORDS_MAX; i++) {
		if (i < key_words)
			e[i] = key[i];
	}
#pragma unroll
	for (int i = 0; i < TABLE_VALUE_WORDS_MAX; i++) {
		if (i < value_words)
			e[key_words + i] = value[i];
	}
}

/* table_mark_used records a lookup of way w, writing only when the bit is
 * not set yet: a bucket's hot ways cost no write. */
static __always_inline void table_mark_used(struct table_head *b, __u32 w)
{
	__u32 bit = 1U << (w & (TABLE_WAYS - 1));

	if (!(b->used & bit))
		__sync_fetch_and_or(&b->used, bit);
}

/* table_bucket returns the bucket of a key's hash h, NULL if the map has
 * fewer than 2^bits buckets. */
static __always_inline struct table_head *table_bucket(void *map, __u32 bits, __u64 h)
{
	__u32 idx = h >> (64 - bits);

	return bpf_map_lookup_elem(map, &idx);
}

/* word_is_zero is 1 when x is 0, else 0, without a branch. BPF has no
 * set-on-compare instruction: a comparison is a jump, which the verifier
 * follows both ways, so the result of a lookup would reach the rest of the
 * program as one state per way (a pointer at a different constant offset
 * each) and multiply what it verifies. Arithmetic gives one state whose
 * value the verifier does not know. The empty asm keeps clang from turning
 * it back into a comparison. */
static __always_inline __u64 word_is_zero(__u64 x)
{
	asm volatile("" : "+r"(x));
	return ((x | -x) >> 63) ^ 1;
}

/* first_way is the lowest way whose bit is set in the non-zero mask m: a
 * 4-bit count of trailing zeros, from a table packed nibble by nibble. */
static __always_inline __u32 first_way(__u64 m)
{
	return (0x0102010301020100ULL >> ((m & 0xf) << 2)) & (TABLE_WAYS - 1);
}

/* table_ways_matching has bit w set for each way of b holding key (tag and
 * key compared), without a branch. */
static __always_inline __u64 table_ways_matching(struct table_head *b, const __u64 *key, __u32 key_words,
						 __u32 entry_words, __u32 tag)
{
	__u64 m = 0;

#pragma unroll
	for (int w = 0; w < TABLE_WAYS; w++) {
		const __u64 *e = table_entry(b, w, entry_words);
		__u64 diff = b->tag[w] ^ tag;

#pragma unroll
		for (int i = 0; i < TABLE_KEY_WORDS_MAX; i++) {
			if (i < key_words)
				diff |= e[i] ^ key[i];
		}
		m |= word_is_zero(diff) << w;
	}
	return m;
}

/* table_lookup returns the value of key's entry, or NULL. It finds the
 * first way whose tag matches and compares that way's key; only when two
 * ways' tags match (one lookup in billions) does it compare every way's. */
static __always_inline void *table_lookup(void *map, __u32 bits, const __u64 *key, __u32 key_words,
					  __u32 value_words)
{
	__u32 entry_words = key_words + value_words;
	__u64 h = table_hash(key, key_words), m = 0;
	__u32 tag = table_tag(h), w;
	struct table_head *b = table_bucket(map, bits, h);
	__u64 *e;

	if (!b)
		return NULL;
#pragma unroll
	for (int i = 0; i < TABLE_WAYS; i++)
		m |= word_is_zero(b->tag[i] ^ tag) << i;
	if (!m)
		return NULL;
	w = first_way(m);
	e = table_entry(b, w, entry_words);
	if (!table_key_equal(e, key, key_words)) {
		m = table_ways_matching(b, key, key_words, entry_words, tag);
		if (!m)
			return NULL;
		w = first_way(m);
		e = table_entry(b, w, entry_words);
	}
	table_mark_used(b, w);
	return e + key_words;
}

/* table_claim takes way w of b for writing if its tag is still old. */
static __always_inline bool table_claim(struct table_head *b, __u32 w, __u32 old)
{
	return __sync_val_compare_and_swap(&b->tag[w & (TABLE_WAYS - 1)], old, TABLE_TAG_BUSY) == old;
}

/* table_publish makes way w, claimed and written, live under tag. A full
 * barrier: what was written before is visible to whoever sees the tag. */
static __always_inline void table_publish(struct table_head *b, __u32 w, __u32 tag)
{
	__sync_val_compare_and_swap(&b->tag[w & (TABLE_WAYS - 1)], TABLE_TAG_BUSY, tag);
}

/* table_store writes key and value into way w of b, which the caller
 * claimed, marks it used and publishes it under tag; returns the value. */
static __always_inline void *table_store(struct table_head *b, __u32 w, __u32 tag, const __u64 *key,
					 __u32 key_words, const __u64 *value, __u32 value_words)
{
	__u64 *e = table_entry(b, w, key_words + value_words);

	table_fill(e, key, key_words, value, value_words);
	table_mark_used(b, w);
	table_publish(b, w, tag);
	return e + key_words;
}

/* table_victim chooses the way to evict from the full bucket b: the first
 * live way not looked up since the bucket's last eviction, else the hand's.
 * Every way then starts over as unused. */
static __always_inline __u32 table_victim(struct table_head *b)
{
	__u32 used = b->used, victim = TABLE_WAYS;

#pragma unroll
	for (int w = TABLE_WAYS - 1; w >= 0; w--) {
		if (!(used & (1U << w)) && (b->tag[w] & TABLE_TAG_LIVE))
			victim = w;
	}
	if (victim == TABLE_WAYS)
		victim = __sync_fetch_and_add(&b->hand, 1) & (TABLE_WAYS - 1);
	__sync_fetch_and_and(&b->used, 0);
	return victim;
}

/* table_keep_old copies the value of entry e, whose way the caller holds
 * busy, into old (value_words words) when old is given. */
static __always_inline void table_keep_old(__u64 *old, const __u64 *e, __u32 key_words, __u32 value_words)
{
	if (!old)
		return;
#pragma unroll
	for (int i = 0; i < TABLE_VALUE_WORDS_MAX; i++) {
		if (i < value_words)
			old[i] = e[key_words + i];
	}
}

/* table_insert stores key with value and returns the stored value, or NULL
 * (*result says what happened, enum table_result). The key's existing entry
 * is rewritten when replace is set, else left as it is (TABLE_EXISTS) and
 * returned. A new key takes a free way, else evicts one. When old is given,
 * it receives the value rewritten (TABLE_REPLACED) or evicted
 * (TABLE_EVICTED): what a table that counts its entries by owner must
 * take back from the owner. */
static __always_inline void *table_insert(void *map, __u32 bits, const __u64 *key, __u32 key_words,
					  const __u64 *value, __u32 value_words, bool replace, int *result,
					  __u64 *old)
{
	__u32 entry_words = key_words + value_words;
	__u64 h = table_hash(key, key_words);
	__u32 tag = table_tag(h), victim, old_tag;
	struct table_head *b = table_bucket(map, bits, h);
	__u64 *e;

	*result = TABLE_FAILED;
	if (!b)
		return NULL;
#pragma unroll
	for (int w = 0; w < TABLE_WAYS; w++) {
		if (b->tag[w] != tag)
			continue;
		e = table_entry(b, w, entry_words);
		if (!table_key_equal(e, key, key_words))
			continue;
		if (!replace) {
			*result = TABLE_EXISTS;
			return e + key_words;
		}
		if (!table_claim(b, w, tag))
			return NULL;
		*result = TABLE_REPLACED;
		table_keep_old(old, e, key_words, value_words);
		return table_store(b, w, tag, key, key_words, value, value_words);
	}
#pragma unroll
	for (int w = 0; w < TABLE_WAYS; w++) {
		if (b->tag[w] != TABLE_TAG_EMPTY || !table_claim(b, w, TABLE_TAG_EMPTY))
			continue;
		*result = TABLE_INSERTED;
		return table_store(b, w, tag, key, key_words, value, value_words);
	}
	for (int i = 0; i < TABLE_INSERT_ATTEMPTS; i++) {
		victim = table_victim(b) & (TABLE_WAYS - 1);
		old_tag = b->tag[victim];
		if (!(old_tag & TABLE_TAG_LIVE) || !table_claim(b, victim, old_tag))
			continue;
		*result = TABLE_EVICTED;
		table_keep_old(old, table_entry(b, victim, entry_words), key_words, value_words);
		return table_store(b, victim, tag, key, key_words, value, value_words);
	}
	return NULL;
}

/* table_delete frees every entry of key (two CPUs inserting one new key at
 * once may each have stored it) and returns how many it freed. */
static __always_inline int table_delete(void *map, __u32 bits, const __u64 *key, __u32 key_words,
					__u32 value_words)
{
	__u64 h = table_hash(key, key_words);
	__u32 tag = table_tag(h);
	struct table_head *b = table_bucket(map, bits, h);
	int freed = 0;

	if (!b)
		return 0;
#pragma unroll
	for (int w = 0; w < TABLE_WAYS; w++) {
		if (b->tag[w] != tag ||
		    !table_key_equal(table_entry(b, w, key_words + value_words), key, key_words))
			continue;
		if (__sync_val_compare_and_swap(&b->tag[w], tag, TABLE_TAG_EMPTY) == tag)
			freed++;
	}
	return freed;
}
