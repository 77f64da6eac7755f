package datapath

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
)

// The subflow table and the police buckets are tables the programs look up
// inline (bpf/include/table.h): buckets of tableWays entries in an array
// map, each entry live when its way's tag has tableTagLive. User space reads
// a table whole and changes it only through the table_ctl program, so that
// its writes claim ways as the programs' do.

const (
	tableWays    = len(datapathTableHead{}.Tag)
	tableTagLive = 1 << 31 // TABLE_TAG_LIVE
	// tableReadChunk is how many buckets one batch lookup reads.
	tableReadChunk = 512
)

// tableID names a table to table_ctl.
type tableID = datapathTableId

const (
	tableSubflows = datapathTableIdTABLE_ID_SUBFLOWS
	tablePolice   = datapathTableIdTABLE_ID_POLICE
)

// tableResult is what an insert did (enum table_result).
type tableResult = datapathTableResult

// readTable calls yield with each live entry of a table map whose buckets
// are B, entries split out by ways. A bucket a program is writing while it
// is read may show that way's entry half written; it is live only once
// published, so such an entry is seen as it was or not at all, except when
// an eviction rewrites a live way during the read (docs/datapath.md).
func readTable[B, E any](m *ebpf.Map, ways func(*B) (*datapathTableHead, []E), yield func(*E)) error {
	keys := make([]uint32, tableReadChunk)
	buckets := make([]B, tableReadChunk)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, buckets, nil)
		for i := range n {
			head, entries := ways(&buckets[i])
			for w := range entries {
				if head.Tag[w]&tableTagLive != 0 {
					yield(&entries[w])
				}
			}
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

func subflowWays(b *datapathSubflowBucket) (*datapathTableHead, []datapathSubflowEntry) {
	return &b.Head, b.E[:]
}

func policeWays(b *datapathPoliceBucket) (*datapathTableHead, []datapathPoliceEntry) {
	return &b.Head, b.E[:]
}

// subflowEntries lists the live entries of a subflow table of this
// release's layout. An entry two CPUs stored at once is listed once.
func subflowEntries(m *ebpf.Map) ([]datapathSubflowEntry, error) {
	var out []datapathSubflowEntry
	seen := map[datapathFlowKey]bool{}
	err := readTable(m, subflowWays, func(e *datapathSubflowEntry) {
		if !seen[e.Key] {
			seen[e.Key] = true
			out = append(out, *e)
		}
	})
	return out, err
}

// policeKeys lists the keys of the live police buckets.
func (d *Datapath) policeKeys() ([]datapathRateKey, error) {
	var out []datapathRateKey
	err := readTable(d.objs.RateBuckets, policeWays, func(e *datapathPoliceEntry) { out = append(out, e.Key) })
	return out, err
}

// tableOp runs one table_ctl request: op on table id with key and value
// (their raw bytes, as the table stores them). It returns the request's
// result: an enum table_result for inserts, entries freed for deletes.
func (d *Datapath) tableOp(id tableID, op datapathTableOpCode, key, value []byte) (int32, error) {
	out, err := d.tableRequest(id, op, key, value)
	return out.Result, err
}

// tableRequest runs one table_ctl request and returns the request as the
// program left it: its result, and what the operation tells besides.
func (d *Datapath) tableRequest(id tableID, op datapathTableOpCode, key, value []byte) (datapathTableOp, error) {
	req := datapathTableOp{Op: uint32(op), Table: uint32(id)}
	if err := putWords(req.Key[:], key); err != nil {
		return datapathTableOp{}, fmt.Errorf("table key: %w", err)
	}
	if err := putWords(req.Value[:], value); err != nil {
		return datapathTableOp{}, fmt.Errorf("table value: %w", err)
	}
	var out datapathTableOp
	if _, err := d.objs.TableCtl.Run(&ebpf.RunOptions{Context: req, ContextOut: &out}); err != nil {
		return datapathTableOp{}, fmt.Errorf("table_ctl: %w", err)
	}
	if out.Result < 0 {
		return datapathTableOp{}, fmt.Errorf("table_ctl refused operation %d on table %d", op, id)
	}
	return out, nil
}

// putWords fills words with b, in native byte order, as the program reads
// them; b must fit.
func putWords(words []uint64, b []byte) error {
	if len(b) > len(words)*8 || len(b)%8 != 0 {
		return fmt.Errorf("%d bytes do not fill whole words of %d", len(b), len(words)*8)
	}
	for i := 0; i < len(b)/8; i++ {
		words[i] = nativeEndian.Uint64(b[8*i:])
	}
	return nil
}

// rawBytes is v as the map stores it.
func rawBytes(v any) []byte {
	b, err := binary.Append(nil, nativeEndian, v)
	if err != nil {
		panic(fmt.Sprintf("encoding %T: %v", v, err)) // fixed-size generated types always encode
	}
	return b
}

// deleteTable frees key's entries in table id and says how many there were.
func (d *Datapath) deleteTable(id tableID, key any) (int, error) {
	n, err := d.tableOp(id, datapathTableOpCodeTABLE_OP_DELETE, rawBytes(key), nil)
	return int(n), err
}

// tableSeedPin is the map keeping the tables' hash seed beside them.
const tableSeedPin = "table_seeds"

// tableSeed returns the seed of the tables pinned under pinDir, or a new
// random one when none is pinned (a new node, a release before tables, or
// no pin directory at all).
func tableSeed(pinDir string) (datapathTableSeedValue, error) {
	var v datapathTableSeedValue
	if pinDir != "" {
		m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, tableSeedPin), nil)
		switch {
		case err == nil:
			defer m.Close()
			if err := m.Lookup(uint32(0), &v); err != nil {
				return v, fmt.Errorf("reading the pinned table seed: %w", err)
			}
			if v != (datapathTableSeedValue{}) {
				return v, nil
			}
		case !errors.Is(err, os.ErrNotExist):
			return v, fmt.Errorf("pinned table seed: %w", err)
		}
	}
	raw := make([]byte, binary.Size(v))
	if _, err := rand.Read(raw); err != nil {
		return v, err
	}
	return v, binary.Read(bytes.NewReader(raw), nativeEndian, &v)
}
