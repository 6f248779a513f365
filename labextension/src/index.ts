/**
 * A status-bar item with the GPUs gpuspawner gave this server: the model, memory in
 * use against what the share entitles to, utilization, and any countdown (the tooltip
 * also says how the GPUs of a multi-GPU server are linked). It reads
 * the server extension's `gpuspawner-lab/status` (gpuspawner_lab/handlers.py), which
 * asks the hub with the server's own token. When the hub announces a stop of the server
 * (a borrowed GPU taken back, a limit), open documents are saved before it. It asks no more often than the node's
 * reports arrive, and shows nothing under a server that gpuspawner did not start.
 */
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Widget } from '@lumino/widgets';

const PLUGIN_ID = 'gpuspawner-lab:status';

interface IDevice {
  uuid: string;
  share: string;
  entitled_mib: number | null;
  used_mib: number | null;
  utilization: number | null;
}

interface INotice {
  reason: string;
  stop_at: string;
  seconds_left: number;
  message: string;
}

/** How the GPUs of a multi-GPU server are linked (the hub's gpu_links.py). */
interface ILinks {
  summary: string;
  detail: string;
}

interface IStatus {
  available: boolean;
  message?: string;
  model?: string;
  host?: string;
  devices?: IDevice[];
  links?: ILinks | null;
  held_for?: string | null;
  stops?: string[];
  notices?: INotice[];
  quota?: string | null;
  refresh_seconds?: number;
}

/**
 * Whether open documents are saved now: a stop the hub announced comes before the
 * next look but one (or within 10 s of it), so an unsaved edit is not lost with the
 * server. Asked again at each look until the stop.
 */
export function saveDue(status: IStatus, nextSeconds: number): boolean {
  return (status.notices ?? []).some(n => n.seconds_left <= 2 * nextSeconds + 10);
}

function gib(mib: number): string {
  return `${(mib / 1024).toFixed(1)} GiB`;
}

/** The item's one line, and the tooltip with everything. */
export function describe(status: IStatus): { text: string; title: string } {
  if (!status.available) {
    return { text: '', title: status.message ?? '' };
  }
  const devices = status.devices ?? [];
  if (devices.length === 0) {
    return { text: 'No GPU', title: 'This server has no GPU (NVIDIA_VISIBLE_DEVICES=void).' };
  }
  const used = devices.reduce((sum, d) => sum + (d.used_mib ?? 0), 0);
  const entitled = devices.reduce((sum, d) => sum + (d.entitled_mib ?? 0), 0);
  const known = devices.some(d => d.used_mib !== null);
  const utils = devices.map(d => d.utilization).filter((u): u is number => u !== null);
  const parts = [`${devices.length > 1 ? devices.length + ' × ' : ''}${status.model}`];
  if (known) {
    parts.push(`${gib(used)} of ${gib(entitled)}`);
  }
  if (utils.length) {
    parts.push(`${Math.round(utils.reduce((a, b) => a + b, 0) / utils.length)} %`);
  }
  const stops = status.stops ?? [];
  if (stops.length) {
    parts.push(stops[0]);
  }
  const lines = [`${status.model} on ${status.host}`];
  for (const d of devices) {
    const memory = d.used_mib === null ? '' : `, ${gib(d.used_mib)} in use of ${gib(d.entitled_mib ?? 0)}`;
    const util = d.utilization === null ? '' : `, ${d.utilization} % busy`;
    lines.push(`${d.uuid}: ${d.share}${memory}${util}`);
  }
  if (status.links) {
    lines.push(status.links.summary);
    if (status.links.detail) {
      lines.push(status.links.detail);
    }
  }
  if (status.held_for) {
    lines.push(`Held for ${status.held_for}`);
  }
  if (status.quota) {
    lines.push(status.quota);
  }
  lines.push(...(status.notices ?? []).map(n => n.message));
  lines.push(...stops.map(s => `Stops: ${s}`));
  return { text: 'GPU: ' + parts.join(' · '), title: lines.join('\n') };
}

class GPUStatus extends Widget {
  constructor() {
    super();
    this.id = 'gpuspawner-lab-status';
    this.addClass('jp-gpuspawner-status');
  }

  show_(status: IStatus): void {
    const { text, title } = describe(status);
    this.node.textContent = text;
    this.node.title = title;
    this.node.dataset.uuids = (status.devices ?? []).map(d => d.uuid).join(',');
    this.setHidden(text === '');
  }
}

async function fetchStatus(settings: ServerConnection.ISettings): Promise<IStatus> {
  const url = URLExt.join(settings.baseUrl, 'gpuspawner-lab', 'status');
  const response = await ServerConnection.makeRequest(url, {}, settings);
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    return { available: false, message: body.message ?? response.statusText };
  }
  return body as IStatus;
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'The GPUs gpuspawner gave this server, in the status bar.',
  autoStart: true,
  requires: [IStatusBar],
  optional: [ISettingRegistry],
  activate: async (app: JupyterFrontEnd, statusBar: IStatusBar, registry: ISettingRegistry | null) => {
    const item = new GPUStatus();
    statusBar.registerStatusItem(PLUGIN_ID, { item, align: 'left', rank: 100 });
    let wanted = 15;
    if (registry) {
      const settings = await registry.load(PLUGIN_ID);
      const read = () => {
        wanted = settings.get('refreshSeconds').composite as number;
      };
      read();
      settings.changed.connect(read);
    }
    const connection = ServerConnection.makeSettings();
    const tick = async () => {
      let next = wanted;
      try {
        const status = await fetchStatus(connection);
        item.show_(status);
        next = Math.max(wanted, status.refresh_seconds ?? wanted);
        const soonest = Math.min(...(status.notices ?? []).map(n => n.seconds_left));
        if (soonest < 2 * next + 10) {
          next = Math.max(2, Math.min(next, soonest / 2)); // look again before the stop
        }
        if (saveDue(status, next) && app.commands.hasCommand('docmanager:save-all')) {
          await app.commands.execute('docmanager:save-all'); // unsaved edits survive the stop
        }
      } catch (error) {
        item.show_({ available: false, message: String(error) });
      }
      window.setTimeout(tick, next * 1000);
    };
    void tick();
  }
};

export default plugin;
