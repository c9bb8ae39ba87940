package nettest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
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
