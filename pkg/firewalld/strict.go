package firewalld

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/godbus/dbus/v5"
)

// Where firewalld keeps its settings (firewalld.conf among them) and its
// defaults; neither is there on a node without firewalld.
var (
	etcDir = "/etc/firewalld"
	usrDir = "/usr/lib/firewalld"
)

// defaultBus is the system bus's socket where DBUS_SYSTEM_BUS_ADDRESS
// names none.
const defaultBus = "/run/dbus/system_bus_socket"

// askTimeout bounds a question to firewalld on a bus the agent holds.
const askTimeout = 2 * time.Second

// StrictForwardPorts says whether firewalld's StrictForwardPorts is on
// (firewalld 2.3 and later): firewalld then drops the connections other
// software DNATed to containers, unless its own forward ports or
// policies let them through. It asks firewalld on the system bus, all of
// it (connect, authenticate, Hello, the property) within ConnectTimeout;
// where no bus is reachable (a runtime without /run/dbus), or the bus or
// firewalld did not answer in that time, it reads firewalld.conf instead,
// which is what firewalld itself applies at its next start or reload, and
// note says why. false, without a question, where firewalld is not
// installed; false where it is installed and does not run, or has no
// such setting (before 2.3); an error where firewalld answers with an
// error of its own, or its settings cannot be read.
func StrictForwardPorts() (strict bool, note string, err error) {
	if !installed() {
		return false, "", nil
	}
	strict, reached, err := askBus(time.Now().Add(ConnectTimeout))
	if reached && !errors.Is(err, errSilent) {
		return strict, "", err
	}
	if err != nil {
		note = fmt.Sprintf("firewalld's StrictForwardPorts read from firewalld.conf: %v", err)
	}
	strict, err = confStrict(filepath.Join(etcDir, "firewalld.conf"))
	return strict, note, err
}

// installed says whether firewalld's directories are there: two stats,
// so that a node without firewalld never connects to its bus on ADD.
func installed() bool {
	for _, d := range []string{etcDir, usrDir} {
		if _, err := os.Stat(d); err == nil {
			return true
		}
	}
	return false
}

// askBus asks firewalld on the system bus before deadline; reached is
// false where no bus is reachable (with the error of the connection
// where there was one to make), and an error is errSilent where
// firewalld did not answer in time.
func askBus(deadline time.Time) (strict, reached bool, err error) {
	if os.Getenv("DBUS_SYSTEM_BUS_ADDRESS") == "" {
		if _, err := os.Stat(defaultBus); err != nil {
			return false, false, nil
		}
	}
	conn, done, err := connect(deadline)
	if errors.Is(err, fs.ErrNotExist) {
		return false, false, nil // no bus where the address says
	}
	if err != nil {
		return false, false, err
	}
	defer done()
	strict, err = ask(conn, deadline)
	return strict, true, err
}

// StrictForwardPorts asks firewalld whether its StrictForwardPorts is on,
// as the package's StrictForwardPorts does, over the bus's connection.
func (b *Bus) StrictForwardPorts() (bool, error) { return ask(b.conn, time.Now().Add(askTimeout)) }

// ask asks firewalld on conn for StrictForwardPorts before deadline:
// false where it does not run or has no such setting.
func ask(conn *dbus.Conn, deadline time.Time) (bool, error) {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	var v dbus.Variant
	err := conn.Object(name, path+"/config").CallWithContext(ctx, "org.freedesktop.DBus.Properties.Get", dbus.FlagNoAutoStart,
		iface+".config", "StrictForwardPorts").Store(&v)
	if errors.Is(err, context.DeadlineExceeded) {
		return false, fmt.Errorf("firewalld: %w", errSilent)
	}
	switch errName(err) {
	case "":
		s, _ := v.Value().(string)
		return isOn(s), nil
	case "org.freedesktop.DBus.Error.ServiceUnknown", "org.freedesktop.DBus.Error.NameHasNoOwner":
		return false, nil // installed, not running: nothing drops
	case "org.freedesktop.DBus.Error.InvalidArgs":
		return false, nil // a firewalld without the setting
	case "org.freedesktop.DBus.Python.dbus.exceptions.DBusException":
		// firewalld 1.3 raises InvalidArgs through dbus-python:
		// "org.freedesktop.DBus.Error.InvalidArgs: Property
		// 'StrictForwardPorts' does not exist"
		if strings.HasPrefix(err.Error(), "org.freedesktop.DBus.Error.InvalidArgs:") {
			return false, nil
		}
		fallthrough
	default:
		return false, fmt.Errorf("ask firewalld for StrictForwardPorts: %s: %w", errName(err), err)
	}
}

// confStrict reads StrictForwardPorts from firewalld.conf as firewalld
// does: KEY=VALUE lines, # and ; comments, the first definition of a key
// counts, a missing key or file is the default (off).
func confStrict(file string) (bool, error) {
	data, err := os.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read firewalld's settings: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		kv := strings.Split(line, "=")
		if len(kv) != 2 || strings.TrimSpace(kv[0]) != "StrictForwardPorts" {
			continue
		}
		if v := strings.TrimSpace(kv[1]); v != "" {
			return isOn(v), nil
		}
	}
	return false, sc.Err()
}

// isOn is firewalld's reading of a yes/no setting: anything but "no" and
// "false" (any case) is on; nothing is the default, off.
func isOn(v string) bool {
	v = strings.ToLower(v)
	return v != "" && v != "no" && v != "false"
}
