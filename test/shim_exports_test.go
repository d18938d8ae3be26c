package test

import (
	"debug/elf"
	"path/filepath"
	"testing"
)

// TestShimExportsOnlyLibcNames checks that bin/libonload.so defines, for
// the dynamic linker, only functions libc defines: the calls it
// interposes (and liburing's calls that make a ring, shim/uring.c:
// uringCalls). Its internal names (drop, ent, mu, fdt and the others the
// files of shim/ share through shim.h) are hidden. Exported, a program's
// own function or variable of the same name would bind to the shim's
// instead, as LD_PRELOAD puts it first.
func TestShimExportsOnlyLibcNames(t *testing.T) {
	onloadd := shimOnloadd(t)
	shim, err := elf.Open(filepath.Join(filepath.Dir(onloadd), "libonload.so"))
	if err != nil {
		t.Fatal(err)
	}
	defer shim.Close()
	libc := findLibc(t, shim.Machine)
	ours := definedDynamic(t, shim)
	theirs := definedDynamic(t, libc)
	for _, want := range []string{"socket", "read", "epoll_wait", "close"} {
		if _, ok := ours[want]; !ok {
			t.Errorf("libonload.so does not define %s", want)
		}
	}
	for name, typ := range ours {
		if uringCalls[name] && typ == elf.STT_FUNC {
			continue
		}
		if libcTyp, ok := theirs[name]; !ok || typ != elf.STT_FUNC || libcTyp != elf.STT_FUNC {
			t.Errorf("libonload.so exports %s (%v), which is not a function of libc's: make it static, or hidden (shim.h)", name, typ)
		}
	}
}

// uringCalls are liburing's calls that make a ring, which the shim
// interposes to see a ring made after its core loaded (shim/uring.c).
var uringCalls = map[string]bool{
	"io_uring_queue_init": true, "io_uring_queue_init_params": true, "io_uring_queue_init_mem": true, "io_uring_setup": true,
}

// definedDynamic lists the global and weak symbols f defines in its
// dynamic symbol table, with their types.
func definedDynamic(t *testing.T, f *elf.File) map[string]elf.SymType {
	t.Helper()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]elf.SymType{}
	for _, s := range syms {
		if s.Section == elf.SHN_UNDEF || elf.ST_BIND(s.Info) == elf.STB_LOCAL ||
			elf.ST_VISIBILITY(s.Other) == elf.STV_HIDDEN {
			continue
		}
		out[s.Name] = elf.ST_TYPE(s.Info)
	}
	return out
}

// findLibc opens the C library for machine m.
func findLibc(t *testing.T, m elf.Machine) *elf.File {
	t.Helper()
	var paths []string
	for _, pat := range []string{"/lib/*/libc.so.6", "/usr/lib/*/libc.so.6", "/lib64/libc.so.6", "/usr/lib64/libc.so.6", "/lib/libc.so.6"} {
		found, _ := filepath.Glob(pat)
		paths = append(paths, found...)
	}
	for _, p := range paths {
		f, err := elf.Open(p)
		if err != nil {
			continue
		}
		if f.Machine == m {
			t.Cleanup(func() { f.Close() })
			return f
		}
		f.Close()
	}
	Missing(t, "no libc.so.6 for %v in %v", m, paths)
	return nil
}
