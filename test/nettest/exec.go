package nettest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// PluginEnv is the environment a runtime gives a plugin binary in binDir
// for one verb: this process's environment without any CNI_ variable,
// then CNI_COMMAND, CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME (eth0) and
// CNI_PATH. With command "" it is the environment of a person running
// the binary by hand (`portmap-agent sync`).
func PluginEnv(command, containerID, netns, binDir string) []string {
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "CNI_") {
			env = append(env, e)
		}
	}
	if command == "" {
		return env
	}
	return append(env, "CNI_COMMAND="+command, "CNI_CONTAINERID="+containerID, "CNI_NETNS="+netns,
		"CNI_IFNAME=eth0", "CNI_PATH="+binDir)
}

func execPlugin(plugin, command, containerID, netns string, stdin []byte) ([]byte, error) {
	cmd := exec.Command(filepath.Join(BinDir(), plugin))
	cmd.Env = PluginEnv(command, containerID, netns, BinDir())
	cmd.Stdin = bytes.NewReader(stdin)
	var out bytes.Buffer
	cmd.Stdout = &out
	err := cmd.Run()
	return out.Bytes(), err
}

// Agent runs our node agent, portmap-agent, from BinDir as a person
// would, e.g. Agent("sync", "--cache-dir", dir), and returns its stdout,
// its stderr and its exit status.
func Agent(args ...string) (stdout, stderr string, status int, err error) {
	return AgentWith(nil, args...)
}

// AgentWith is Agent with exactly the capabilities caps ("NET_ADMIN",
// ...) in its bounding set, and so in effect (it runs as root), as in a
// container given them: setpriv --bounding-set. Nil: every capability.
func AgentWith(caps []string, args ...string) (stdout, stderr string, status int, err error) {
	argv := append(withCaps(caps), filepath.Join(BinDir(), "portmap-agent"))
	return runAgent(exec.Command(argv[0], append(argv[1:], args...)...))
}

// withCaps is the command line that runs what follows it with exactly
// the capabilities caps in its bounding set (setpriv); nil caps: none.
func withCaps(caps []string) []string {
	if caps == nil {
		return nil
	}
	set := "-all"
	for _, c := range caps {
		set += ",+" + strings.ToLower(c)
	}
	return []string{"setpriv", "--bounding-set", set, "--"}
}

// runAgent runs cmd, an agent's, as a person would (no CNI_ variable),
// and returns its stdout, its stderr and its exit status.
func runAgent(cmd *exec.Cmd) (stdout, stderr string, status int, err error) {
	cmd.Env = PluginEnv("", "", "", "")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return out.String(), errb.String(), ee.ExitCode(), nil
	}
	return out.String(), errb.String(), 0, err
}
