package hosting

import "iter"

// entityTable is a shard's resident entities, under Shard.mu: a map of
// IDs per kind (indexed by Kind.idx), so a lookup hashes the entity's ID
// only (a small map's, none at all) instead of a struct of two strings.
type entityTable struct {
	byKind []map[string]*resident
	n      int
}

// get returns the entity id of kind k, or nil.
func (t *entityTable) get(k *Kind, id string) *resident {
	if k.idx < len(t.byKind) {
		return t.byKind[k.idx][id]
	}
	return nil
}

// set lists e.
func (t *entityTable) set(e *resident) {
	i := e.kind.idx
	if i >= len(t.byKind) {
		t.byKind = append(t.byKind, make([]map[string]*resident, i+1-len(t.byKind))...)
	}
	m := t.byKind[i]
	if m == nil {
		m = make(map[string]*resident)
		t.byKind[i] = m
	}
	if _, ok := m[e.key.ID]; !ok {
		t.n++
	}
	m[e.key.ID] = e
}

// remove unlists e (if listed).
func (t *entityTable) remove(e *resident) {
	if t.get(e.kind, e.key.ID) == e {
		delete(t.byKind[e.kind.idx], e.key.ID)
		t.n--
	}
}

// len returns the number of entities listed.
func (t *entityTable) len() int { return t.n }

// all yields every entity listed; the loop may remove the one yielded.
func (t *entityTable) all() iter.Seq[*resident] {
	return func(yield func(*resident) bool) {
		for _, m := range t.byKind {
			for _, e := range m {
				if !yield(e) {
					return
				}
			}
		}
	}
}

// clear unlists every entity.
func (t *entityTable) clear() {
	for _, m := range t.byKind {
		clear(m)
	}
	t.n = 0
}
