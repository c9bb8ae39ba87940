package agent

import (
	"context"
	"log/slog"
	"time"
)

// What a watcher's pass writes to its log: the changes, and the
// attachments withheld and objects kept that the pass before did not
// have, each once.

// logChanges logs what a pass found wrong or did, one record each, and a
// summary; nothing when everything was right. Orphans that are only
// listed, and cache files skipped as unusable, are logged once.
func logChanges(log *slog.Logger, r *Report, trigger string, took time.Duration, logged map[string]bool) {
	n := 0
	for _, a := range r.Attachments {
		if a.State == "ok" {
			continue
		}
		n++
		level := slog.LevelInfo
		if a.State == "error" {
			level = slog.LevelError
		}
		log.Log(context.Background(), level, "attachment "+a.State, "network", a.Network, "container", a.ContainerID,
			"ifname", a.IfName, "backend", a.Backend, "what", a.What)
	}
	for _, s := range r.Shared {
		n++
		log.Info("shared object repaired", "backend", s.Backend, "family", s.Family, "what", s.What)
	}
	for _, s := range r.Removed {
		n++
		log.Info("shared object removed", "backend", s.Backend, "family", s.Family, "what", s.What)
	}
	for _, o := range r.Orphans {
		k := o.Backend + o.Family + o.Object
		if o.State == "orphan" && logged[k] {
			continue
		}
		logged[k] = true
		n++
		level := slog.LevelInfo
		if o.State == "error" {
			level = slog.LevelError
		}
		args := []any{"network", o.Network, "container", o.ContainerID, "backend", o.Backend, "family", o.Family, "object", o.Object}
		if o.Error != "" {
			args = append(args, "err", o.Error)
		}
		log.Log(context.Background(), level, o.State, args...)
	}
	for _, s := range r.Skipped {
		if s.Error && !logged[s.File] {
			logged[s.File] = true
			n++
			log.Warn("cache entry skipped", "file", s.File, "why", s.Why)
		}
	}
	if k := "not pruned: " + r.NotPruned; r.NotPruned != "" && !logged[k] {
		logged[k] = true
		n++
		log.Warn("orphans not pruned", "why", r.NotPruned)
	}
	for _, s := range r.NotRun {
		if k := "not run: " + s.Backend + s.Family; !logged[k] {
			logged[k] = true
			n++
			log.Warn("unit not run", "backend", s.Backend, "family", s.Family, "why", s.What)
		}
	}
	if n == 0 {
		return
	}
	sm := r.Summary
	log.Info("pass", "trigger", trigger, "took", took.Round(time.Millisecond).String(), "attachments", sm.Attachments, "ok", sm.OK,
		"repaired", sm.Repaired, "errors", sm.Errors, "orphans", sm.Orphans, "pruned", sm.Pruned)
}

// logHeld logs the withheld attachments and kept objects of a pass that
// the pass before it (*withheld, *kept, which it updates) did not have,
// one record each, and returns the new withheld ones by reason. An entry
// that stays (a cache entry a runtime left behind after DEL) is logged
// once, not every pass.
func logHeld(log *slog.Logger, r *Report, withheld, kept *map[string]bool) map[string]int {
	fresh := map[string]int{}
	now := make(map[string]bool, len(r.Withheld))
	for _, w := range r.Withheld {
		k := w.File + "\x00" + w.Reason
		now[k] = true
		if !(*withheld)[k] {
			fresh[w.Reason]++
			log.Info("attachment withheld", "network", w.Network, "container", w.ContainerID, "ifname", w.IfName,
				"reason", w.Reason, "why", w.Why)
		}
	}
	*withheld = now
	now = make(map[string]bool, len(r.Kept))
	for _, o := range r.Kept {
		k := o.Backend + o.Family + o.Object
		now[k] = true
		if !(*kept)[k] {
			log.Info("kept", "network", o.Network, "container", o.ContainerID, "backend", o.Backend, "family", o.Family,
				"object", o.Object, "why", o.Error)
		}
	}
	*kept = now
	return fresh
}
