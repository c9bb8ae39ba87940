package bpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Map types the socket path uses (enum bpf_map_type).
const (
	Hash    uint32 = unix.BPF_MAP_TYPE_HASH
	LRUHash uint32 = unix.BPF_MAP_TYPE_LRU_HASH
)

// MapSpec is a map to create.
type MapSpec struct {
	Name       string // at most 15 bytes
	Type       uint32
	KeySize    uint32
	ValueSize  uint32
	MaxEntries uint32
	Flags      uint32
}

// MapInfo is what the kernel says of a map.
type MapInfo struct {
	Type, KeySize, ValueSize, MaxEntries, Flags uint32
	Name                                        string
}

// Map is an open map.
type Map struct {
	object
	keySize, valueSize uint32
}

type mapCreateAttr struct {
	MapType    uint32
	KeySize    uint32
	ValueSize  uint32
	MaxEntries uint32
	MapFlags   uint32
	InnerMapFD uint32
	NumaNode   uint32
	MapName    [unix.BPF_OBJ_NAME_LEN]byte
}

// NewMap creates a map.
func NewMap(s MapSpec) (*Map, error) {
	attr := mapCreateAttr{MapType: s.Type, KeySize: s.KeySize, ValueSize: s.ValueSize,
		MaxEntries: s.MaxEntries, MapFlags: s.Flags, MapName: objName(s.Name)}
	fd, err := lockedMemory(func() (int, error) { return bpf(unix.BPF_MAP_CREATE, &attr) })
	if err != nil {
		return nil, fmt.Errorf("create map %s: %w", s.Name, err)
	}
	return &Map{object: object{fd}, keySize: s.KeySize, valueSize: s.ValueSize}, nil
}

// LoadPinnedMap opens the map pinned at path.
func LoadPinnedMap(path string) (*Map, error) {
	fd, err := objGet(path)
	if err != nil {
		return nil, err
	}
	m := &Map{object: object{fd}}
	info, err := m.Info()
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	m.keySize, m.valueSize = info.KeySize, info.ValueSize
	return m, nil
}

// Info reads the map's type, sizes and name.
func (m *Map) Info() (MapInfo, error) {
	var b [40]byte // struct bpf_map_info up to its name
	if err := m.info(b[:]); err != nil {
		return MapInfo{}, fmt.Errorf("map info: %w", err)
	}
	le := binary.LittleEndian
	return MapInfo{Type: le.Uint32(b[0:]), KeySize: le.Uint32(b[8:]), ValueSize: le.Uint32(b[12:]),
		MaxEntries: le.Uint32(b[16:]), Flags: le.Uint32(b[20:]), Name: cString(b[24:40])}, nil
}

type elemAttr struct {
	MapFD uint32
	_     uint32
	Key   pointer
	Value pointer // or the next key
	Flags uint64
}

// elem runs one element command; ENOENT is ErrKeyNotExist.
func (m *Map) elem(cmd uintptr, key, value []byte, flags uint64) error {
	attr := elemAttr{MapFD: uint32(m.fd), Key: bytesPtr(key), Value: bytesPtr(value), Flags: flags}
	_, err := bpf(cmd, &attr)
	runtime.KeepAlive(key)
	runtime.KeepAlive(value)
	if errors.Is(err, unix.ENOENT) {
		return ErrKeyNotExist
	}
	return err
}

func (m *Map) check(key, value []byte) error {
	if key != nil && uint32(len(key)) != m.keySize || value != nil && uint32(len(value)) != m.valueSize {
		return fmt.Errorf("bpf: %d/%d-byte key/value for a map of %d/%d", len(key), len(value), m.keySize, m.valueSize)
	}
	return nil
}

// Lookup reads key's value into value.
func (m *Map) Lookup(key, value []byte) error {
	if err := m.check(key, value); err != nil {
		return err
	}
	return m.elem(unix.BPF_MAP_LOOKUP_ELEM, key, value, 0)
}

// Update sets key to value (BPF_ANY).
func (m *Map) Update(key, value []byte) error {
	if err := m.check(key, value); err != nil {
		return err
	}
	return m.elem(unix.BPF_MAP_UPDATE_ELEM, key, value, unix.BPF_ANY)
}

// Delete removes key.
func (m *Map) Delete(key []byte) error {
	if err := m.check(key, nil); err != nil {
		return err
	}
	return m.elem(unix.BPF_MAP_DELETE_ELEM, key, nil, 0)
}

// NextKey writes the key after key (nil: the first) into next;
// ErrKeyNotExist at the end.
func (m *Map) NextKey(key, next []byte) error {
	if err := m.check(key, nil); err != nil {
		return err
	}
	if err := m.check(next, nil); err != nil {
		return err
	}
	return m.elem(unix.BPF_MAP_GET_NEXT_KEY, key, next, 0)
}

type batchAttr struct {
	InBatch   pointer
	OutBatch  pointer
	Keys      pointer
	Values    pointer
	Count     uint32
	MapFD     uint32
	ElemFlags uint64
	Flags     uint64
}

// raw is s's memory: K and V are byte arrays (or structs without
// pointers or padding), as the maps' keys and values are.
func raw[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(s[0])))
}

// batch runs a batch command over n elements; it returns how many the
// kernel did.
func (m *Map) batch(cmd uintptr, attr *batchAttr, keys, values []byte) (int, error) {
	attr.MapFD = uint32(m.fd)
	attr.Keys, attr.Values = bytesPtr(keys), bytesPtr(values)
	_, err := bpf(cmd, attr)
	runtime.KeepAlive(keys)
	runtime.KeepAlive(values)
	if errors.Is(err, unix.ENOENT) {
		err = ErrKeyNotExist
	}
	return int(attr.Count), err
}

func sized[T any](want uint32, what string) error {
	var z T
	if uint32(unsafe.Sizeof(z)) != want {
		return fmt.Errorf("bpf: %d-byte %s for a map of %d", unsafe.Sizeof(z), what, want)
	}
	return nil
}

// Dump reads every element of m in batches.
func Dump[K, V any](m *Map) ([]K, []V, error) {
	if err := errors.Join(sized[K](m.keySize, "keys"), sized[V](m.valueSize, "values")); err != nil {
		return nil, nil, err
	}
	const chunk = 4096
	var keys []K
	var vals []V
	kb, vb := make([]K, chunk), make([]V, chunk)
	var cursor [8]byte // a hash map's batch token is its next bucket
	attr := batchAttr{OutBatch: ptr(&cursor)}
	for first := true; ; first = false {
		attr.InBatch, attr.Count = pointer{}, chunk
		if !first {
			attr.InBatch = ptr(&cursor)
		}
		n, err := m.batch(unix.BPF_MAP_LOOKUP_BATCH, &attr, raw(kb), raw(vb))
		keys, vals = append(keys, kb[:n]...), append(vals, vb[:n]...)
		if err == ErrKeyNotExist {
			return keys, vals, nil
		}
		if err != nil {
			return nil, nil, fmt.Errorf("batch lookup: %w", err)
		}
	}
}

// BatchUpdate sets each of keys to its value.
func BatchUpdate[K, V any](m *Map, keys []K, values []V) error {
	if len(keys) != len(values) {
		return fmt.Errorf("bpf: %d keys, %d values", len(keys), len(values))
	}
	if err := errors.Join(sized[K](m.keySize, "keys"), sized[V](m.valueSize, "values")); err != nil {
		return err
	}
	if len(keys) == 0 {
		return nil
	}
	attr := batchAttr{Count: uint32(len(keys))}
	if _, err := m.batch(unix.BPF_MAP_UPDATE_BATCH, &attr, raw(keys), raw(values)); err != nil {
		return fmt.Errorf("batch update: %w", err)
	}
	return nil
}

// DeleteAll deletes keys; a key already gone is not an error.
func DeleteAll[K any](m *Map, keys []K) error {
	if err := sized[K](m.keySize, "keys"); err != nil {
		return err
	}
	for len(keys) > 0 {
		attr := batchAttr{Count: uint32(len(keys))}
		n, err := m.batch(unix.BPF_MAP_DELETE_BATCH, &attr, raw(keys), nil)
		if err == nil {
			return nil
		}
		if err != ErrKeyNotExist {
			return fmt.Errorf("batch delete: %w", err)
		}
		// the batch stopped at keys[n], which is gone: on past it
		keys = keys[n+1:]
	}
	return nil
}
