package runner_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// cartEntity checkpoints its items when released and deletes its
// checkpoint once checked out: the checkpoint-on-release pattern with an
// end of life.
type cartEntity struct {
	Items      map[string]int
	CheckedOut bool
	env        *cartEnv
}

type cartEnv struct {
	mu      sync.Mutex
	deletes map[string]func(context.Context) error // the last DeleteCheckpoint handed to each cart
}

type cartAdd struct {
	SKU string
	Qty int
}

type cartCheckout struct{}

func (c *cartEntity) Add(_ context.Context, r cartAdd) (int, error) {
	c.Items[r.SKU] += r.Qty
	return len(c.Items), nil
}

func (c *cartEntity) Checkout(_ context.Context, _ cartCheckout) (int, error) {
	n := len(c.Items)
	c.Items, c.CheckedOut = map[string]int{}, true
	return n, nil
}

func (c *cartEntity) Activate(ctx context.Context, info entity.ActivateInfo) error {
	c.env.mu.Lock()
	c.env.deletes[info.Entity] = info.DeleteCheckpoint
	c.env.mu.Unlock()
	b, ok, err := info.Restore(ctx)
	if err != nil || !ok {
		return err
	}
	return json.Unmarshal(b, &c.Items)
}

func (c *cartEntity) Release(ctx context.Context, info entity.ReleaseInfo) error {
	if c.CheckedOut {
		return info.DeleteCheckpoint(ctx) // its state ended: nothing to keep
	}
	b, err := json.Marshal(c.Items)
	if err != nil {
		return err
	}
	return info.Checkpoint(ctx, b)
}

// TestDeletedEntitiesLeaveNoCheckpoints: entities checkpoint when they are
// passivated; once their state ended they delete their checkpoint, fenced
// by their epoch, so checkpoints do not pile up in the store.
func TestDeletedEntitiesLeaveNoCheckpoints(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		env := &cartEnv{deletes: map[string]func(context.Context) error{}}
		k := entity.NewKind("cart", func(string) *cartEntity { return &cartEntity{Items: map[string]int{}, env: env} },
			entity.IdleAfter(time.Minute))
		add := entity.Method(k, "add", (*cartEntity).Add)
		checkout := entity.Method(k, "checkout", (*cartEntity).Checkout)
		c, r, _ := startOwningAll(t, runner.Config{ID: "a", NumShards: 8}, k)
		store := c.NewStore("check")
		const carts = 50
		id := func(i int) string { return fmt.Sprintf("cart-%d", i) }
		stored := func() (n int) {
			for i := range carts {
				_, ok, err := store.ReadCheckpoint(t.Context(), sharding.ShardOf(id(i), 8), "cart/"+id(i))
				if err != nil {
					t.Fatal(err)
				}
				if ok {
					n++
				}
			}
			return n
		}
		ctx := t.Context()
		for i := range carts {
			if _, err := add.Ask(ctx, r, id(i), cartAdd{SKU: "sku-1", Qty: 1}); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(2 * time.Minute) // passivated: checkpointed
		if n := stored(); n != carts {
			t.Fatalf("%d checkpoints after passivation, want %d", n, carts)
		}
		for i := range carts {
			if i%5 < 3 { // 30 carts check out
				if n, err := checkout.Ask(ctx, r, id(i), cartCheckout{}); err != nil || n != 1 {
					t.Fatalf("checkout %s = %d, %v; want the restored item", id(i), n, err)
				}
			} else if n, err := add.Ask(ctx, r, id(i), cartAdd{SKU: "sku-2", Qty: 1}); err != nil || n != 2 {
				t.Fatalf("add to %s = %d, %v; want the restored item and the new one", id(i), n, err)
			}
		}
		time.Sleep(2 * time.Minute)
		if n := stored(); n != carts-30 {
			t.Fatalf("%d checkpoints after 30 of %d carts checked out, want %d", n, carts, carts-30)
		}

		// Fenced: a DeleteCheckpoint of an epoch that ended deletes nothing.
		env.mu.Lock()
		stale := env.deletes[id(3)]
		env.mu.Unlock()
		r.Detach() // re-attaching gives every shard a new epoch
		waitFor(t, time.Minute, "owning all shards again", func() bool { return len(r.Owned()) == 8 && !r.Status().Detached })
		if err := stale(ctx); !errors.Is(err, storage.ErrFenced) {
			t.Fatalf("DeleteCheckpoint of an ended epoch = %v, want ErrFenced", err)
		}
		if n := stored(); n != carts-30 {
			t.Fatalf("%d checkpoints after a fenced delete, want %d", n, carts-30)
		}
	})
}
