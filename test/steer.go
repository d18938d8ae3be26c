package test

import (
	"errors"
	"fmt"

	"github.com/xdp-onload/onload/bpf"
	"github.com/xdp-onload/onload/vnic"
	"github.com/xdp-onload/onload/xdp"
)

// Steered is the data path of one host: the steering program attached to
// an interface and an XDP NIC on one of its queues registered as a stack,
// receiving what the listeners select.
type Steered struct {
	NIC      *vnic.XDP
	Steering *bpf.Steering
	Attach   *xdp.Attachment
	Stack    bpf.StackID
	Queue    int
}

// SteerConfig says what to steer to the NIC.
type SteerConfig struct {
	Listeners []bpf.Listener
	Stack     bpf.StackID
	NIC       vnic.XDPConfig // Interface defaults to the iface given to Steer
	Attach    xdp.AttachMode
}

// Steer loads and attaches the steering program on iface in its host,
// opens an XDP NIC on it and registers the listeners for it.
func Steer(iface *Iface, cfg SteerConfig) (*Steered, error) {
	if cfg.NIC.Interface == "" {
		cfg.NIC.Interface = iface.Name
	}
	s := &Steered{Stack: cfg.Stack, Queue: cfg.NIC.Queue}
	err := iface.Host.Do(func() error {
		var err error
		if s.Steering, err = bpf.Load(); err != nil {
			return err
		}
		if s.Attach, err = xdp.Attach(s.Steering.Program(), cfg.NIC.Interface, cfg.Attach); err != nil {
			return err
		}
		if s.NIC, err = vnic.OpenXDP(cfg.NIC); err != nil {
			return err
		}
		if err = s.Steering.SetSocket(cfg.Stack, cfg.NIC.Queue, s.NIC.RxFD()); err != nil {
			return err
		}
		for _, l := range cfg.Listeners {
			if err = s.Steering.AddListener(l, cfg.Stack); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("steer %s in host %s: %w", iface.Name, iface.Host.Name, err)
	}
	return s, nil
}

// Close detaches the program and closes the NIC and the maps.
func (s *Steered) Close() error {
	var errs []error
	if s.Attach != nil {
		errs = append(errs, s.Attach.Close())
	}
	if s.NIC != nil {
		errs = append(errs, s.NIC.Close())
	}
	if s.Steering != nil {
		errs = append(errs, s.Steering.Close())
	}
	return errors.Join(errs...)
}
