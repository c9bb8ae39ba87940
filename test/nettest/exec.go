package nettest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

func execPlugin(plugin, command, containerID, netns string, stdin []byte) ([]byte, error) {
	cmd := exec.Command(filepath.Join(BinDir(), plugin))
	cmd.Env = append(os.Environ(),
		"CNI_COMMAND="+command, "CNI_CONTAINERID="+containerID, "CNI_NETNS="+netns,
		"CNI_IFNAME=eth0", "CNI_PATH="+BinDir())
	cmd.Stdin = bytes.NewReader(stdin)
	var out bytes.Buffer
	cmd.Stdout = &out
	err := cmd.Run()
	return out.Bytes(), err
}

// Portmap runs our binary from BinDir as a person would (no CNI_COMMAND),
// e.g. Portmap("sync", "--cache-dir", dir), and returns its stdout, its
// stderr and its exit status.
func Portmap(args ...string) (stdout, stderr string, status int, err error) {
	cmd := exec.Command(filepath.Join(BinDir(), "portmap"), args...)
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "CNI_") {
			env = append(env, e)
		}
	}
	cmd.Env = env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return out.String(), errb.String(), ee.ExitCode(), nil
	}
	return out.String(), errb.String(), 0, err
}
