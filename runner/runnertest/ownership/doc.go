// Package ownership checks recorded runner events for double ownership: a
// shard acquired by one runner while another still owned it.
//
// It is the single-owner check of the runner tests and the churn
// benchmark, and the report of each runner's last events a failed test
// prints (LastEvents). Use it in your own fault tests the same way:
// subscribe to every runner ([runner.Runner.Subscribe]), merge their
// events in time order and check [Overlaps] is empty. It reads events only (no storage, no clock), starts
// no goroutines and is safe for concurrent use.
package ownership
