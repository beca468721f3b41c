// Client-side service sources for the v8 seed harness, written against the
// PUBLISHED packages only (@earendil-works/chord@0.85.1, pi-client@0.85.1).
//
// pi's durable client keeps two "service sources" per connection (pi's
// coding-agent `experimental/services/connection.ts`, which is not published):
//
// - a server source: chord bindings routed to the server target {serverId},
//   rebound when the connection comes and goes, with a `connection` state;
// - a Session source: chord bindings routed to the client's current
//   attachment {serverId, sessionId, attachmentId}, rebound on every
//   `attachment` envelope, with an `attachment` state that goes
//   detached → attaching → attached (or degraded when hydration fails). The
//   source numbers attachments (the "attachment generation"): the outcome of
//   a rebind for a superseded attachment is ignored, so a slow hydration of
//   the previous Session can never mark it attached.
//
// This file re-implements that behaviour (not its code) so that the seed
// scenarios that depend on it (10, 11, 14, 15, 17, 18, ...) can run against
// any v8 server. Both classes implement chord's `RemoteServiceSource`
// (`acceptsUnavailableServices`, `catalogue`, `open`).
import { createRemoteServiceBinding, replicatedState } from "@earendil-works/chord";
import { BACKGROUND_CONTEXT } from "@earendil-works/chord/context";
import { createClientServiceTransport } from "@earendil-works/pi-client";

const BG = BACKGROUND_CONTEXT;

function toError(error) {
	return error instanceof Error ? error : new Error(String(error));
}

/** Resolves when all settle; rethrows the one failure, or an AggregateError of several. */
async function settleAll(promises, message) {
	const results = await Promise.allSettled(promises);
	const errors = results.filter((r) => r.status === "rejected").map((r) => r.reason);
	if (errors.length === 1) throw errors[0];
	if (errors.length > 1) throw new AggregateError(errors, message);
}

/** Publishes `value` as the whole new value of a mutable replicated state. */
function publishValue(state, value, context = BG) {
	const draft = state.state;
	for (const key of Object.keys(draft)) if (!Object.hasOwn(value, key)) delete draft[key];
	Object.assign(draft, value);
	state.publish(context);
}

function sameRoute(a, b) {
	if (a === undefined || b === undefined) return a === b;
	return a.serverId === b.serverId && a.sessionId === b.sessionId && a.attachmentId === b.attachmentId;
}

/**
 * One chord binding that starts unbound and is (re)bound by its source.
 * `ready` binds it on first use, waits for hydration, then runs the source's
 * activation check once.
 */
class SourceBinding {
	#inner;
	#isBound;
	#activate;
	#forget;
	#started = false;
	#activated = false;

	constructor({ services, transport, isBound, activate, assertAccess, onError, forget }) {
		this.#inner = createRemoteServiceBinding({ services, transport, bound: false, assertAccess, onError });
		this.#isBound = isBound;
		this.#activate = activate ?? (async () => {});
		this.#forget = forget;
	}

	use(service) {
		return this.#inner.use(service);
	}

	observe(service, handler) {
		return this.#inner.observe(service, handler);
	}

	async ready(context) {
		if (!this.#started) {
			this.#started = true;
			await this.#inner.rebind(this.#isBound(), context);
		}
		await this.hydrated(context);
		if (!this.#activated) {
			await this.#activate(context);
			this.#activated = true;
		}
	}

	/** Waits for every acquired service of the current binding generation. */
	hydrated(context) {
		return this.#inner.ready(context);
	}

	/** Rebinds (only once started: an unstarted binding binds on `ready`). */
	setBound(bound, context) {
		return this.#started ? this.#inner.rebind(bound, context) : Promise.resolve();
	}

	async dispose(context) {
		this.#forget();
		await this.#inner.dispose(context);
	}
}

function connectionValue(client, error) {
	switch (client.connectionState) {
		case "connected":
			return { status: "connected", since: new Date().toISOString() };
		case "connecting":
			return { status: "connecting" };
		default:
			return { status: "disconnected", reason: error?.message ?? "Client is disconnected" };
	}
}

/** Server-scoped services of one connection (target {serverId}). */
export class ServerServiceSource {
	acceptsUnavailableServices = false;
	connection;
	#client;
	#transport;
	#bindings = new Set();
	#onError;
	#stopListening;
	#transition = Promise.resolve();
	#disposed = false;

	constructor(client, { onError } = {}) {
		this.#client = client;
		this.#onError = onError ?? (() => {});
		this.#transport = createClientServiceTransport(client, () => ({ serverId: client.serverId }));
		this.connection = replicatedState(connectionValue(client));
		this.#stopListening = client.onConnectionStateChange(({ state, error }) => {
			publishValue(this.connection, connectionValue(client, error));
			const bound = state === "connected";
			this.#transition = this.#transition
				.then(() => settleAll([...this.#bindings].map((b) => b.setBound(bound, BG)), "Failed to rebind server services"))
				.catch((e) => this.#onError(toError(e)));
		});
	}

	catalogue(context) {
		return this.#client.serviceCatalogue({ serverId: this.#client.serverId }, context.abortSignal);
	}

	open({ services, assertAccess, onError }) {
		if (this.#disposed) throw new Error("Server service source is disposed");
		const binding = new SourceBinding({
			services,
			transport: this.#transport,
			isBound: () => this.#client.connected,
			assertAccess,
			onError,
			forget: () => this.#bindings.delete(binding),
		});
		this.#bindings.add(binding);
		return binding;
	}

	async dispose(context) {
		if (this.#disposed) return;
		this.#disposed = true;
		this.#stopListening();
		await this.#transition;
		const bindings = [...this.#bindings];
		this.#bindings.clear();
		await settleAll(
			bindings.map((b) => b.dispose(context)),
			"Failed to dispose server service source",
		);
	}
}

/** Services of the client's current Session attachment. */
export class SessionServiceSource {
	attachment;
	#client;
	#transport;
	#bindings = new Set();
	#onError;
	#stopListening;
	#transitions = new Set();
	#catalogue;
	#generation = 0;
	#disposed = false;

	constructor(client, { onError } = {}) {
		this.#client = client;
		this.#onError = onError ?? (() => {});
		this.#transport = createClientServiceTransport(client, () => client.attachment);
		const route = client.attachment;
		this.attachment = replicatedState(
			route === undefined ? { status: "detached" } : { status: "attaching", sessionId: route.sessionId },
		);
		this.#stopListening = client.onAttachmentChange((next) => this.#routeChanged(next));
	}

	get acceptsUnavailableServices() {
		return this.#client.attachment === undefined && this.#catalogue === undefined;
	}

	/** True while `route` is still the attachment of generation `generation`. */
	#isCurrent(route, generation) {
		return this.#generation === generation && sameRoute(this.#client.attachment, route);
	}

	#routeChanged(route) {
		const generation = ++this.#generation;
		if (route !== undefined) {
			publishValue(this.attachment, { status: "attaching", sessionId: route.sessionId });
			this.#client.serviceCatalogue(route).then(
				(catalogue) => {
					if (this.#isCurrent(route, generation)) this.#catalogue = catalogue;
				},
				(error) => this.#onError(toError(error)),
			);
		}
		const transition = settleAll(
			[...this.#bindings].map((b) => b.setBound(route !== undefined, BG)),
			"Failed to rebind Session services",
		);
		this.#transitions.add(transition);
		transition.then(
			() => {
				this.#transitions.delete(transition);
				if (!this.#isCurrent(route, generation)) return;
				publishValue(
					this.attachment,
					route === undefined ? { status: "detached" } : { status: "attached", sessionId: route.sessionId },
				);
			},
			(error) => {
				this.#transitions.delete(transition);
				if (!this.#isCurrent(route, generation)) return;
				publishValue(
					this.attachment,
					route === undefined ? { status: "detached" } : { status: "degraded", sessionId: route.sessionId },
				);
				this.#onError(toError(error));
			},
		);
	}

	async catalogue(context) {
		const route = this.#client.attachment;
		if (route === undefined) return this.#catalogue ?? [];
		this.#catalogue = await this.#client.serviceCatalogue(route, context.abortSignal);
		return this.#catalogue;
	}

	open({ services, assertAccess, onError }) {
		if (this.#disposed) throw new Error("Session service source is disposed");
		const binding = new SourceBinding({
			services,
			transport: this.#transport,
			isBound: () => this.#client.attachment !== undefined,
			activate: (context) => {
				const route = this.#client.attachment;
				return route === undefined
					? this.#settleDetached(this.#generation, context)
					: this.#settleAttached(route, this.#generation, context);
			},
			assertAccess,
			onError,
			forget: () => this.#bindings.delete(binding),
		});
		this.#bindings.add(binding);
		return binding;
	}

	/** Waits until the current attachment (which must be `sessionId`) has hydrated every binding. */
	async whenAttached(sessionId, context) {
		const route = this.#client.attachment;
		if (route === undefined || route.sessionId !== sessionId) {
			throw new Error(`Session ${sessionId} is not the current attachment`);
		}
		await this.#settleAttached(route, this.#generation, context);
	}

	/** Waits until every binding has released the previous attachment. */
	async whenDetached(context) {
		if (this.#client.attachment !== undefined) throw new Error("A Session is still attached");
		await this.#settleDetached(this.#generation, context);
	}

	async #settleAttached(route, generation, context) {
		try {
			await Promise.all([...this.#bindings].map((b) => b.hydrated(context)));
		} catch (error) {
			if (this.#isCurrent(route, generation)) {
				publishValue(this.attachment, { status: "degraded", sessionId: route.sessionId }, context);
			}
			throw error;
		}
		if (!this.#isCurrent(route, generation)) {
			throw new Error(`Session ${route.sessionId} was replaced while attaching`);
		}
		const state = this.attachment.value;
		if (state.status !== "attached" || state.sessionId !== route.sessionId) {
			publishValue(this.attachment, { status: "attached", sessionId: route.sessionId }, context);
		}
	}

	async #settleDetached(generation, context) {
		await Promise.all([...this.#bindings].map((b) => b.hydrated(context)));
		if (this.#generation !== generation || this.#client.attachment !== undefined) {
			throw new Error("The Session attachment changed while detaching");
		}
		if (this.attachment.value.status !== "detached") publishValue(this.attachment, { status: "detached" }, context);
	}

	async dispose(context) {
		if (this.#disposed) return;
		this.#disposed = true;
		this.#stopListening();
		await Promise.allSettled([...this.#transitions]);
		const bindings = [...this.#bindings];
		this.#bindings.clear();
		await settleAll(
			bindings.map((b) => b.dispose(context)),
			"Failed to dispose Session service source",
		);
	}
}

/**
 * A server source with one binding of `services`, activated at once (the
 * shape of the seed's `createServerServiceBinding` test helper).
 */
export function serverBinding(client, { services, onError }) {
	const report = onError ?? (() => {});
	const source = new ServerServiceSource(client, { onError });
	const binding = source.open({ services, assertAccess() {}, onError: report });
	const activation = binding.ready(BG);
	activation.catch(report);
	return {
		source,
		connection: source.connection,
		catalogue: (context) => source.catalogue(context),
		use: (service) => binding.use(service),
		observe: (service, handler) => binding.observe(service, handler),
		async ready(context) {
			await activation;
			await binding.ready(context);
		},
		async dispose(context) {
			await settleAll([binding.dispose(context), source.dispose(context)], "Failed to dispose server services");
		},
	};
}

/**
 * A Session source with one binding of `services`, activated at once (the
 * shape of the seed's `createSessionServiceBinding` test helper).
 */
export function sessionBinding(client, { services, onError }) {
	const report = onError ?? (() => {});
	const source = new SessionServiceSource(client, { onError });
	const binding = source.open({ services, assertAccess() {}, onError: report });
	const activation = binding.ready(BG);
	activation.catch(report);
	return {
		source,
		attachment: source.attachment,
		catalogue: (context) => source.catalogue(context),
		use: (service) => binding.use(service),
		observe: (service, handler) => binding.observe(service, handler),
		whenAttached: (sessionId, context) => source.whenAttached(sessionId, context),
		whenDetached: (context) => source.whenDetached(context),
		async ready(context) {
			await activation;
			const state = source.attachment.value;
			if (state.status === "detached") await source.whenDetached(context);
			else await source.whenAttached(state.sessionId, context);
		},
		async dispose(context) {
			await settleAll([binding.dispose(context), source.dispose(context)], "Failed to dispose Session services");
		},
	};
}
